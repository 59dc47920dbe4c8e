"""One attention problem as the algorithms see it: sizes, options and element sizes."""

from __future__ import annotations

from dataclasses import dataclass

from iosim.inputs import AttentionShape

# Bytes per element of the tensors an algorithm moves. The statistics ℓ and m are
# kept in float32 when the data is narrower, as FlashAttention's kernels do.
DTYPE_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
MASK_ITEMSIZE = 1  # a boolean mask is one byte per element


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPE_ITEMSIZE:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPE_ITEMSIZE)}")
    return dtype


@dataclass(frozen=True)
class Problem:
    """Sizes and options of one run. ``has_mask`` says whether a boolean mask is read from HBM."""

    shape: AttentionShape
    tau: float
    causal: bool = False
    has_mask: bool = False
    dropout_p: float = 0.0
    seed: int = 0
    dtype: str = "float16"

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def stat_itemsize(self) -> int:
        return max(4, self.itemsize)

    def itemsize_of(self, tensor: str) -> int:
        """Bytes per element of an HBM tensor, by its name."""
        if tensor == "mask":
            return MASK_ITEMSIZE
        if tensor in ("l", "m"):
            return self.stat_itemsize
        return self.itemsize
