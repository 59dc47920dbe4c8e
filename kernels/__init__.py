"""kernels: real GPU attention kernels (Numba CUDA) computing what iosim's algorithms simulate.

One module per algorithm (standard, flash, flash_swapped) and a thin host API:
``attention`` and ``attention_backward``, with ``IMPLS`` the registry of names.
"""

from kernels.api import IMPLS, KernelOutput, attention, attention_backward, max_head_dim, resolve_config
from kernels.config import Dropout, TileConfig
from kernels.standard import MatmulConfig

__all__ = [
    "IMPLS",
    "Dropout",
    "KernelOutput",
    "MatmulConfig",
    "TileConfig",
    "attention",
    "attention_backward",
    "max_head_dim",
    "resolve_config",
]
