"""Variants of the problem that real models run: block masks (block sparsity), paged KV caches and packed documents
(varlen)."""
