"""Test-wide setup. The CUDA simulator must be chosen before numba is first imported.

By default the kernel tests run under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1),
so CI needs no GPU. IOSIM_GPU=1 runs them on the real GPU instead:

    IOSIM_GPU=1 python -m pytest tests/test_kernels*.py

and enables tests/test_kernels_gpu.py, whose sizes the simulator cannot reach.
"""

import os
import sys

GPU_SWITCH = "IOSIM_GPU"
_gpu = os.environ.get(GPU_SWITCH, "0")
if _gpu not in ("0", "1"):
    raise ValueError(f"{GPU_SWITCH}={_gpu!r}; allowed values are '0' (CUDA simulator, default) and '1' (real GPU)")
if _gpu == "1":
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "0":
        raise ValueError(
            f"{GPU_SWITCH}=1 asks for the real GPU but NUMBA_ENABLE_CUDASIM="
            f"{os.environ['NUMBA_ENABLE_CUDASIM']!r} asks for the simulator; unset one of them"
        )
else:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # The simulator runs each GPU thread as a Python thread; a short switch
    # interval keeps barrier-heavy kernels from crawling.
    sys.setswitchinterval(5e-4)
