"""The DRAM level of a request: the two-level count beside what a GPU's L2 lets through to DRAM.

``dram`` counts a request with ``count`` (the algorithm, M, the tiling of the block
policy on the GPU preset's SMs, on the two-level ``Memory``) and runs the
algorithm's grid of thread blocks against the preset's L2 (``iosim.gpu.l2``). The model,
its sources and its limits: docs/gpu.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.api import count
from iosim.core.counts import Counts
from iosim.core.errors import InputError
from iosim.gpu.l2 import DramCounts, L2Options
from iosim.gpu.lockstep import passes_dram
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling, one_pass


@dataclass(frozen=True)
class DramResult:
    """A request on a GPU preset: the two-level HBM count (elements) and the DRAM bytes behind its L2."""

    algorithm: str
    problem: Problem
    M: int
    forward_tiling: Tiling | None  # None without a forward pass
    backward_tiling: Tiling | None  # None without a backward pass
    gpu: str
    hbm: Counts  # the two-level count, as iosim.count gives it
    dram: DramCounts  # bytes: reads (L2 misses), writes during the kernels, dirty at their end

    @property
    def tiling(self) -> Tiling | None:
        """The tiling of a one-pass request; None when both passes ran."""
        return one_pass(self.forward_tiling, self.backward_tiling)


def dram(algorithm, *, N, d, M, N_k=None, batch=1, heads=1, causal=False, dtype="float16", block_policy="fit",
         tiling=None, kv_heads=None, pass_="fwd", gpu="h100", l2_bytes=None, blocks_per_sm=None,
         window=None, schedule="lockstep") -> DramResult:
    """The DRAM bytes of ``algorithm``'s kernels on ``gpu``, beside its two-level count.

    Each pass's kernels run from a cold L2 (``iosim.gpu.l2.in_sequence``), as ncu measures
    them. ``l2_bytes`` overrides the preset's effective L2 capacity, ``blocks_per_sm``
    the kernels' residency and ``schedule`` how their first blocks start (``iosim.gpu.l2.SCHEDULES``); a pass whose algorithm declares no grid of thread blocks is
    refused. The forward passes of flash and flash-swapped have closed forms
    (milliseconds); a backward pass is simulated, which takes seconds to minutes at
    batch·heads in the hundreds and N in the thousands. ``window`` is taken as ``count``
    takes it, and a sliding window (other than causal's (−1, 0)) is refused: no kernel of
    iosim takes one.
    """
    if gpu is None:
        raise InputError("gpu=None: the DRAM level needs a GPU preset, such as gpu='h100'")
    l2 = L2Options(l2_bytes, blocks_per_sm, schedule)
    r = count(algorithm, N=N, d=d, M=M, N_k=N_k, batch=batch, heads=heads, causal=causal, dtype=dtype,
              block_policy=block_policy, tiling=tiling, kv_heads=kv_heads, pass_=pass_, gpu=gpu, window=window)
    return DramResult(r.algorithm, r.problem, r.M, r.forward_tiling, r.backward_tiling, gpu, r.traffic,
                      passes_dram(r.plans, gpu, l2.capacity, l2.blocks_per_sm, l2.schedule))
