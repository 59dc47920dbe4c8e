"""A paged KV cache: K and V in pages of ``page_size`` tokens, found through a block table.

A serving engine (vLLM's PagedAttention, flash-attn's ``block_table``, FlashInfer) keeps
each request's K/V cache in fixed-size pages scattered in HBM; a request's block table
lists its pages in order, one int32 per page. A paged kernel walks the keys as an
unpaged one does, and before it loads a K/V block it reads the table entries of the
pages the block lies in, to find their addresses.

How iosim counts it:

- **K and V are read by rows.** A part-filled last page is read only up to the last
  token, with predicated loads, as flash-attn's and FlashInfer's paged kernels do (their
  loads are masked row by row past ``seqlen_k``). K and V traffic is therefore the same
  as without pages, at any page size. (vLLM's ``paged_attention`` v1/v2 kernels load a
  last page whole and zero the rows past the context: that would add up to
  ``page_size − 1`` rows per K/V load; iosim does not count that variant.)
- **The block table is its own tensor** (``block_table``, int32, 4 bytes an entry, one
  entry per page), and every K/V block load reads the entries of the pages it spans.
- **K/V blocks respect pages**: a block holds whole pages or lies in one, as a paged
  kernel's do (flash-attn requires its K/V block to divide the page; vLLM's block is one
  page), so B_c is a multiple or a divisor of the page size. A block of b keys then
  reads ⌈b/page_size⌉ entries: the pages of a block-aligned run of keys.

Numerics do not change: the table maps the same keys to other addresses, and the
simulator addresses K and V logically.
"""

from __future__ import annotations

from dataclasses import replace

from iosim.core.errors import InputError
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, ceil_div
from iosim.core.units import parse_count


def check_page_size(page_size) -> int | None:
    """None (no pages) or a whole number of tokens ≥ 1."""
    return None if page_size is None else parse_count("page_size", page_size)


def pages_read(pb: Problem, cols: slice) -> slice:
    """The block-table entries a load of key rows ``cols`` reads: the pages those rows lie in."""
    p = pb.page_size
    return slice(cols.start // p, ceil_div(cols.stop, p))


def entries(pb: Problem, b_j: int) -> int:
    """Entries a K/V block of b_j keys reads: ⌈b_j/page_size⌉, its blocks being page-aligned (0 unpaged)."""
    return ceil_div(b_j, pb.page_size) if pb.page_size else 0


def aligned(pb: Problem, tiling: Tiling, fixed: bool) -> Tiling:
    """``tiling`` with K/V blocks that respect the pages: B_c a multiple or a divisor of the page size.

    A policy's B_c is rounded down to a multiple of the page (or, below one page, to the
    largest divisor of it), which only shrinks the working set; a ``fixed`` (user-given)
    B_c that does neither is refused.
    """
    p, Bc = pb.page_size, tiling.Bc
    if p is None or Bc % p == 0 or p % Bc == 0 or Bc == pb.shape.n_k:
        return tiling
    if fixed:
        raise InputError(f"tiling B_c={Bc} with page_size={p}: a paged K/V block holds whole pages or lies in one; "
                         f"allowed: B_c a multiple or a divisor of {p}")
    if Bc > p:
        return replace(tiling, Bc=Bc // p * p)
    return replace(tiling, Bc=max(b for b in range(1, Bc + 1) if p % b == 0))
