"""iosim: the IO cost of attention, simulated, predicted and checked.

    >>> import iosim
    >>> r = iosim.count("flash", N=4096, d=64, M="100k")
    >>> r.traffic.total == iosim.predict("flash", N=4096, d=64, M="100k").exact.total
    True
"""

from iosim.api import PredictResult, RNGState, SimResult, count, predict, simulate
from iosim.blocks import BlockSizeError
from iosim.memory import CapacityError, Traffic
from iosim.reference import attention_backward_ref, attention_ref
from iosim.registry import ALGORITHMS

__all__ = [
    "ALGORITHMS", "BlockSizeError", "CapacityError", "PredictResult", "RNGState", "SimResult", "Traffic",
    "attention_backward_ref", "attention_ref", "count", "predict", "simulate",
]
