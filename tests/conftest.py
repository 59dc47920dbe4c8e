"""Test-wide setup. The CUDA simulator must be chosen before numba is first imported."""

import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

if os.environ["NUMBA_ENABLE_CUDASIM"] == "1":
    # The simulator runs each GPU thread as a Python thread; a short switch
    # interval keeps barrier-heavy kernels from crawling.
    sys.setswitchinterval(5e-4)
