"""kernels: real GPU attention kernels (Numba CUDA) computing what iosim's algorithms simulate.

One module per algorithm (standard, flash, flash_swapped) and a thin host API:
``attention`` and ``attention_backward``, with ``IMPLS`` the registry of names.
"""

from iosim.kernels.api import IMPLS, KernelOutput, attention, attention_backward, max_head_dim, resolve_config
from iosim.kernels.config import Dropout, TileConfig
from iosim.kernels.standard import MatmulConfig

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
