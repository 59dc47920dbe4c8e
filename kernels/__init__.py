"""kernels: real GPU attention kernels (Numba CUDA) computing what iosim's algorithms simulate.

One module per algorithm (standard, flash, flash_swapped, flash_swapped_tc) and a thin
host API: ``attention`` and ``attention_backward``, with ``IMPLS`` the registry of names;
``to_bfloat16`` and ``from_bfloat16`` convert float32 to bfloat16 bit patterns and back.
"""

import importlib.util

if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
    raise ImportError("iosim.kernels needs Numba and numba-cuda, which the simulator does not: "
                      "pip install 'iosim[kernels]' (or, from a clone, pip install -e '.[kernels]')")

from iosim.kernels.api import IMPLS, KernelOutput, attention, attention_backward, max_head_dim, resolve_config
from iosim.kernels.bfloat16 import from_bfloat16, to_bfloat16
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
    "from_bfloat16",
    "max_head_dim",
    "resolve_config",
    "to_bfloat16",
]
