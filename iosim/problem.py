"""One attention problem as the algorithms see it: sizes, options and element sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from iosim.errors import InputError, InputTypeError
from iosim.inputs import AttentionShape
from iosim.rng import check_dropout_p, check_seed
from iosim.units import DTYPE_ITEMSIZE, check_dtype

if TYPE_CHECKING:
    from iosim.sparsity import BlockSparsity

# Bytes per element of the tensors an algorithm moves, by element class: "data" is
# the problem's dtype; "stat" (the softmax statistics ℓ and m) is kept in float32 when
# the data is narrower, as FlashAttention's kernels do; "mask" is one byte a boolean.
MASK_ITEMSIZE = 1
STAT_MIN_ITEMSIZE = 4
ELEMENTS = ("data", "stat", "mask")


@dataclass(frozen=True)
class Problem:
    """Sizes and options of one run, checked when built. ``has_mask``: a boolean mask is read from HBM."""

    shape: AttentionShape
    tau: float
    causal: bool = False
    has_mask: bool = False
    dropout_p: float = 0.0
    seed: int = 0
    dtype: str = "float16"
    block_sparsity: BlockSparsity | None = None  # the block mask of a block-sparse run; others ignore it
    # query heads packed into the query rows (``packed()``): 1, or the GQA group of an algorithm that serves
    # a whole group from one K/V load; row r is then query r mod N_q/packed of the group's head r // (N_q/packed)
    packed: int = 1

    def __post_init__(self):
        if not isinstance(self.shape, AttentionShape):
            raise InputTypeError(f"shape={self.shape!r} must be an AttentionShape")
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not math.isfinite(self.tau) \
                or self.tau == 0:
            raise InputError(f"tau={self.tau!r} must be a finite non-zero number")
        for name in ("causal", "has_mask"):
            if not isinstance(getattr(self, name), bool):
                raise InputTypeError(f"{name}={getattr(self, name)!r} must be True or False")
        check_dropout_p(self.dropout_p)
        check_seed(self.seed)
        check_dtype(self.dtype)
        from iosim.sparsity import BlockSparsity  # sparsity needs visits, which needs Problem

        if self.block_sparsity is not None and not isinstance(self.block_sparsity, BlockSparsity):
            raise InputTypeError(f"block_sparsity={self.block_sparsity!r} must be an iosim.BlockSparsity or None")

    def packed_by_group(self) -> Problem:
        """The problem as an algorithm that serves each GQA group from one K/V load sees it.

        The group's G = heads/kv_heads query heads become G·N_q query rows of one K/V head
        (Flash-Decoding's packing): batch·kv_heads heads run in lockstep and Q, O (and a mask)
        are the same HBM bytes reshaped, (batch, kv_heads, G·N_q, ·).
        """
        s = self.shape
        if self.packed != 1:
            raise ValueError("the problem is packed already")
        shape = AttentionShape(s.batch, s.kv_heads, s.group * s.n_q, s.n_k, s.d, kv_heads=s.kv_heads)
        return replace(self, shape=shape, packed=s.group)

    @property
    def queries(self) -> int:
        """N_q of one head before packing."""
        return self.shape.n_q // self.packed

    def dim(self, name: str) -> int:
        """A size by the name tensors use for it: N_q, N_k, d, or 1."""
        return {"N_q": self.shape.n_q, "N_k": self.shape.n_k, "d": self.shape.d, "1": 1}[name]

    def itemsize(self, element: str = "data") -> int:
        """Bytes per element of the element class ``element`` (one of ELEMENTS)."""
        if element == "mask":
            return MASK_ITEMSIZE
        data = DTYPE_ITEMSIZE[self.dtype]
        return max(STAT_MIN_ITEMSIZE, data) if element == "stat" else data
