"""Test-wide setup. The CUDA simulator must be chosen before numba is first imported.

By default the kernel tests run under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1),
so CI needs no GPU. IOSIM_GPU=1 runs them on the real GPU instead:

    IOSIM_GPU=1 python -m pytest tests/test_kernels*.py

and enables tests/test_kernels_gpu.py, whose sizes the simulator cannot reach.

Hypothesis runs under the profile named by HYPOTHESIS_PROFILE, else ``ci`` when the
environment variable CI is set (as GitHub Actions sets it), else ``dev`` (Hypothesis's
defaults with no deadline). ``ci`` is derandomized: each run draws the same examples, so
CI time and CI results do not vary from run to run; a test's own ``max_examples`` still
applies. ``dev`` keeps drawing new examples, which is how new failures are found.
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


# Below the switch: NUMBA_ENABLE_CUDASIM must be set before anything that could import numba.
from hypothesis import HealthCheck, settings  # noqa: E402

# Counts with N up to 10⁵ take variable time: no example-level deadline in any profile.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
