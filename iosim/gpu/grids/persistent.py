"""A persistent grid over flash-swapped's forward tiles, as FlashAttention-3 and the CuTile kernel of arXiv 2601.16032
launch: one thread block (CTA) per slot, each taking tile after tile. No kernel of this repository runs it; it
describes the order, so that the sawtooth the paper measured can be set beside the one kernels/flash_swapped.py runs.

The tiles are flash-swapped's forward blocks (``iosim.gpu.grids.flash_swapped.forward``: tile t = batch·head·T_r + i
reads Q_i, the key blocks it sees, writes O_i and lse_i). With W CTAs, CTA c takes tiles c, c + W, c + 2W, … (the
k-th a "wave"), so in lockstep every CTA works on wave k at once. ``sawtooth`` (the paper's order: "alternates the
scan direction" with each CTA's successive tiles) visits the key blocks of odd waves last to first, so that a wave
starts on the K_j, V_j the wave before ended on. Without it, and where every tile has as many steps (no causal
mask), the persistent grid moves what the dispatched grid moves under lockstep (tests/test_persistent.py). It is
not among ``iosim.gpu.kernels``' descriptions: ``experiments/sawtooth_orders.py`` runs it with its CTAs given.

``in_waves`` is its lockstep count's fast form: where every tile has as many steps, the CTAs run wave k's tiles at
once, which is the dispatched grid with ``ctas`` slots whose k-th wave of blocks scans downwards in the sawtooth; the
blocks of one head and one wave then share their steps and run as cohorts (``iosim.gpu.schedule``), where the CTAs'
chained tiles run step by step. tests/test_persistent.py holds the two equal.
"""

from __future__ import annotations

from itertools import chain

from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.gpu.grids import flash_swapped
from iosim.gpu.l2 import Grid


def forward(pb: Problem, tiling: Tiling, per_sm: int, ctas: int, sawtooth: bool = False) -> Grid:
    """``ctas`` CTAs (the SMs × ``per_sm`` that are resident at once), CTA c running tiles c, c + ctas, … in turn,
    odd waves' key blocks downwards where ``sawtooth``."""
    up = flash_swapped.forward(pb, tiling, per_sm)
    down = flash_swapped.ordered_forward(pb, tiling, per_sm, lambda b: True)

    def steps(c: int):
        return chain.from_iterable((down if sawtooth and k % 2 else up).steps(t)
                                   for k, t in enumerate(range(c, up.blocks, ctas)))

    return Grid(min(ctas, up.blocks), steps, up.tiles, per_sm)


def in_waves(pb: Problem, tiling: Tiling, per_sm: int, ctas: int, sawtooth: bool = False) -> Grid | None:
    """``forward``'s accesses under lockstep with ``ctas`` blocks at once, as a dispatched grid of its tiles, odd
    waves downwards where ``sawtooth``; None where the tiles' steps differ (a mask): the CTAs then run no waves."""
    if not pb.band.full or pb.has_mask:
        return None
    return flash_swapped.ordered_forward(pb, tiling, per_sm, lambda b: sawtooth and b // ctas % 2 == 1)
