"""A model as iosim sees it: the attention of each of its layers, as declarative data.

A model, to iosim, is the attention of each of its layers: how many query heads, how
many K/V heads (grouped-query attention), the head sizes, and whether the layer attends
to every earlier key (a global layer), to a sliding window of the last W keys (a local
layer) or to the earlier keys of its own chunk (a chunked layer). Everything else a model
has (the MLP, the norms, the embeddings, the KV cache's capacity) is out of scope:
``iosim.models.cost`` counts attention only. ``iosim.models.presets`` holds published
models, ``iosim.models.hf_config`` reads Hugging Face config files into the same
``ModelConfig``.
"""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass

from iosim.core.errors import InputError
from iosim.core.inputs import check_flag
from iosim.core.units import DTYPE_ITEMSIZE

# Hugging Face's names of a layer's attention (layer_types)
GLOBAL, LOCAL, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


def check_count(name: str, value, least: int = 1) -> int:
    if type(value) is not int or value < least:
        raise InputError(f"{name}={value!r} must be a whole number >= {least}")
    return value


@dataclass(frozen=True)
class LayerKind:
    """The attention of a group of layers that count the same: a global layer, a local one of window W, or a chunked
    one of chunk C (Llama 4: a query sees the earlier keys of its own C-token chunk)."""

    window: int | None  # W, the keys a query sees, itself included (HF's sliding_window); None: every earlier key
    layers: int  # how many of the model's layers are of this kind
    chunk: int | None = None  # C, HF's attention_chunk_size, on a chunked layer

    @property
    def label(self) -> str:
        if self.chunk is not None:
            return f"chunked {self.chunk}"
        return "global" if self.window is None else f"local {self.window}"


@dataclass(frozen=True)
class ModelConfig:
    """The attention of one decoder model, every layer causal. Numbers as its config.json states them."""

    name: str
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads: K/V heads shared by the query heads (grouped-query attention)
    head_dim: int  # head_dim, or hidden_size / num_attention_heads
    max_context: int | None  # max_position_embeddings; None where the config has none (then N must be given)
    source: str  # where the numbers come from: the config.json's URL, or the file given
    sliding_window: int | None = None  # W of the local layers; None when no layer is local
    layer_types: tuple[str, ...] = ()  # GLOBAL, LOCAL or CHUNKED, one a layer; () means every layer GLOBAL
    dropout_p: float = 0.0  # attention_dropout, applied in a training step only
    attention_chunk: int | None = None  # C of the chunked layers (attention_chunk_size); None when none is chunked
    sinks: bool = False  # learned attention sinks, one logit a query head (gpt-oss; Problem.sinks)
    v_head_dim: int | None = None  # V's head size where it differs from head_dim (Q's and K's); None: head_dim
    # multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): K and V come from one latent of this rank a token, and a
    # RoPE key of qk_rope_head_dim shared by every head; head_dim is then qk_nope_head_dim + qk_rope_head_dim
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    def __post_init__(self):
        for name in ("layers", "heads", "kv_heads", "head_dim"):
            check_count(name, getattr(self, name))
        for name, least in (("v_head_dim", 1), ("kv_lora_rank", 1), ("qk_rope_head_dim", 0)):
            if getattr(self, name) is not None:
                check_count(name, getattr(self, name), least)
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise InputError(f"kv_lora_rank={self.kv_lora_rank!r} with qk_rope_head_dim={self.qk_rope_head_dim!r}: "
                             f"multi-head latent attention needs both, other attention neither")
        if self.mla and self.kv_heads != self.heads:
            raise InputError(f"num_key_value_heads={self.kv_heads} with kv_lora_rank={self.kv_lora_rank}: multi-head "
                             f"latent attention expands one K/V head per query head; allowed: num_key_value_heads = "
                             f"num_attention_heads = {self.heads}")
        if self.mla and not self.qk_rope_head_dim < self.head_dim:
            raise InputError(f"qk_rope_head_dim={self.qk_rope_head_dim} of a head of {self.head_dim}: the RoPE key is "
                             f"part of the head, beside qk_nope_head_dim >= 1")
        if self.max_context is not None:
            check_count("max_position_embeddings", self.max_context)
        if self.heads % self.kv_heads:
            raise InputError(f"num_key_value_heads={self.kv_heads} must divide num_attention_heads={self.heads}")
        if self.layer_types and len(self.layer_types) != self.layers:
            raise InputError(f"layer_types has {len(self.layer_types)} entries; num_hidden_layers={self.layers}")
        unknown = sorted(set(self.layer_types) - {GLOBAL, LOCAL, CHUNKED})
        if unknown:
            raise InputError(f"layer_types holds {unknown}; iosim counts {GLOBAL!r}, {LOCAL!r} and {CHUNKED!r} layers")
        for name, value, kind in (("sliding_window", self.sliding_window, LOCAL),
                                  ("attention_chunk_size", self.attention_chunk, CHUNKED)):
            if kind in self.layer_types or value is not None:
                check_count(name, value)
            if value is not None and kind not in self.layer_types:  # it would change no layer, said or not
                raise InputError(f"{name}={value!r} with no {kind!r} layer in layer_types: it would change none; "
                                 f"allowed: layer_types naming the layers it applies to (iosim.load_config reads "
                                 f"them from a config's rules), or {name}=None")
        if (isinstance(self.dropout_p, bool) or not isinstance(self.dropout_p, numbers.Real)
                or not 0 <= self.dropout_p < 1):
            raise InputError(f"attention_dropout={self.dropout_p!r} is outside the allowed range [0, 1)")
        check_flag("sinks", self.sinks)

    def kinds(self) -> tuple[LayerKind, ...]:
        """The distinct kinds of layer and how many layers each: what is counted once and multiplied."""
        counts = Counter(self.layer_types or (GLOBAL,) * self.layers)
        return tuple(LayerKind(self.sliding_window if kind == LOCAL else None, counts[kind],
                               self.attention_chunk if kind == CHUNKED else None)
                     for kind in (LOCAL, CHUNKED, GLOBAL) if counts[kind])

    @property
    def grouped(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention: K and V from one latent a token (``kv_lora_rank``)."""
        return self.kv_lora_rank is not None

    @property
    def d_v(self) -> int:
        """V's head size: v_head_dim, else head_dim."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    def latent_heads(self) -> tuple[int, int]:
        """(d, d_v) of MLA's decode with the projections absorbed (FlashMLA): every query head against one latent of
        kv_lora_rank and the RoPE key, d = kv_lora_rank + qk_rope_head_dim, and V the latent alone,
        d_v = kv_lora_rank."""
        if not self.mla:
            raise ValueError(f"{self.name} has no latent attention")
        return self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank

    def kv_cache_bytes(self, dtype: str) -> dict:
        """The KV cache a token adds, per layer and over every layer (a local layer keeps at most W tokens, a chunked
        one at most C; this is the cost of one more token until then), and what it holds (``what``): K and V of every
        K/V head, or MLA's one latent and RoPE key."""
        item = DTYPE_ITEMSIZE[dtype]
        if self.mla:
            per_layer = self.latent_heads()[0] * item
            what = (f"one latent of {self.kv_lora_rank} and a RoPE key of {self.qk_rope_head_dim}, × {item} B, shared "
                    f"by every head")
        else:
            per_layer = self.kv_heads * (self.head_dim + self.d_v) * item
            sizes = f"{self.head_dim}" if self.d_v == self.head_dim else f"({self.head_dim} + {self.d_v})"
            what = f"K and V, {self.kv_heads} K/V heads × {sizes} × {item} B" + " each" * (self.d_v == self.head_dim)
        return {"per_layer": per_layer, "per_token": per_layer * self.layers, "what": what}


def uniform(layers: int, kind: str = GLOBAL) -> tuple[str, ...]:
    return (kind,) * layers


def pattern_layers(pattern: int, layers: int) -> tuple[str, ...]:
    """Gemma 3's layers: every ``pattern``-th global, the others local (transformers' Gemma3TextConfig: layer i is
    "sliding_attention" where (i + 1) mod sliding_window_pattern is not 0)."""
    return tuple(LOCAL if (i + 1) % pattern else GLOBAL for i in range(layers))


def alternating(layers: int) -> tuple[str, ...]:
    """Local first, then global, alternating: Gemma 2's layers (transformers' ``is_sliding = not layer_idx % 2``) and
    gpt-oss's (transformers' GptOssConfig: layer i "sliding_attention" where (i + 1) mod 2 is not 0)."""
    return tuple(LOCAL if i % 2 == 0 else GLOBAL for i in range(layers))
