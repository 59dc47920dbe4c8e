"""iosim: the IO cost of attention, simulated, predicted and checked.

    >>> import iosim
    >>> r = iosim.count("flash", N=4096, d=64, M="100k")
    >>> r.traffic == iosim.predict("flash", N=4096, d=64, M="100k").exact
    True
"""

from iosim.algorithms.algorithm import Algorithm, Tensor
from iosim.api import count, predict, simulate
from iosim.core.counts import Counts, TensorCounts
from iosim.core.errors import BlockSizeError, InputError, InputTypeError, SearchTooLargeError
from iosim.core.memory import CapacityError
from iosim.core.problem import Band
from iosim.core.tiling import Tiling
from iosim.gpu.dram import DramResult, DramTooLong, dram
from iosim.gradients import GradResult, gradients
from iosim.models.config import ModelConfig
from iosim.models.cost import ModelReport, model
from iosim.models.hf_config import load_config
from iosim.models.presets import PRESETS as MODELS
from iosim.reference import attention_backward_ref, attention_ref, sinks_gradient_ref
from iosim.registry import ALGORITHMS, register
from iosim.results import PredictResult, SimResult
from iosim.serving.cascade import Cascade, cascade, simulate_cascade
from iosim.serving.chunked import ChunkedPrefill, chunked_prefill
from iosim.variants.flex import FlexBlockMask, block_mask
from iosim.variants.sparsity import BlockSparsity

__all__ = [
    "ALGORITHMS", "Algorithm", "Band", "BlockSizeError", "BlockSparsity", "CapacityError", "Cascade", "ChunkedPrefill",
    "Counts", "DramResult", "DramTooLong", "FlexBlockMask", "GradResult", "InputError", "InputTypeError", "MODELS",
    "ModelConfig",
    "ModelReport",
    "PredictResult", "SearchTooLargeError", "SimResult", "Tensor", "TensorCounts", "Tiling", "attention_backward_ref",
    "attention_ref", "block_mask", "cascade", "chunked_prefill", "count", "dram", "gradients", "load_config", "model",
    "predict",
    "register", "simulate", "simulate_cascade", "sinks_gradient_ref",
]
