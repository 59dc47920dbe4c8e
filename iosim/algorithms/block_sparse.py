"""Block-sparse FlashAttention (Dao et al. 2022, section 3.3, Algorithm 5), forward and backward.

Algorithms 2 and 4 run over the tiles a block mask M̃ leaves nonzero
(``iosim.variants.sparsity``): a zero tile is never computed, so its keys are masked out of
every query row of the block. As the paper writes it, the outer loop still loads K_j
and V_j (Alg. 2 line 7; Alg. 4 lines 7 and 24 write dK_j, dV_j) before the inner loop
finds the column's nonzero tiles, so only the inner steps are skipped. ``block-sparse-skip``
(``block_sparse_skip.py``) also skips a key block whose whole column of tiles is zero.

The block mask is the problem's ``block_sparsity``, defined on the run's own tiles; with
none, every tile is nonzero and the counts are those of ``flash``. A training step runs
both passes on the same tiles (``Needs.block_mask``): the backward's, which fit both. With a band (causal, or
a sliding window), tiles it hides entirely are skipped too. On-chip buffers are those of Algorithms 2 and 4.

Deviations: as ``flash`` and ``flash backward`` (see their modules).
"""

from __future__ import annotations

from iosim.algorithms import flash, flash_backward
from iosim.algorithms.algorithm import Algorithm, Needs
from iosim.core.counts import Counts
from iosim.core.flops import Flops
from iosim.core.memory import Memory
from iosim.core.problem import Problem
from iosim.core.tiling import Tiling
from iosim.variants.sparsity import sparse_visits


def fraction(pb: Problem) -> float:
    """The s of the paper's formula as the problem states it: the fraction of nonzero blocks asked for."""
    return 1.0 if pb.block_sparsity is None else pb.block_sparsity.sparsity


def variant(name: str, skips_empty_columns: bool) -> Algorithm:
    """Block-sparse FlashAttention, forward with its backward; ``skips_empty_columns`` never loads an empty column."""

    def tiles(pb: Problem, tiling: Tiling):
        return sparse_visits(pb, tiling, skips_empty_columns)

    def run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
        flash.run_on(mem, pb, tiling, tiles(pb, tiling))

    def traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
        return flash.traffic_on(pb, tiling, M, tiles(pb, tiling))

    def flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
        return flash.flops_on(pb, tiles(pb, tiling))

    def paper_form(pb: Problem, M: int) -> float:
        """The seed's s·(12N²d²/M + 16N²d/M) + 3Nd, with N² ↦ N_q·N_k and N ↦ N_q."""
        n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
        return pb.shape.bh * (fraction(pb) * (12 * n_q * n_k * d * d / M + 16 * n_q * n_k * d / M) + 3 * n_q * d)

    def backward_run(mem: Memory, pb: Problem, tiling: Tiling) -> None:
        flash_backward.run_on(mem, pb, tiling, tiles(pb, tiling))

    def backward_traffic(pb: Problem, tiling: Tiling, M: int) -> Counts:
        return flash_backward.traffic_on(pb, tiling, M, tiles(pb, tiling))

    def backward_flops(pb: Problem, tiling: Tiling, M: int) -> Flops:
        return flash_backward.flops_on(pb, tiles(pb, tiling))

    def backward_paper_form(pb: Problem, M: int) -> float:
        """Algorithm 4's count with the inner steps scaled by s: s·(20N²d²/M + 8N²d/M) + 7Nd."""
        n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
        return pb.shape.bh * (fraction(pb) * (20 * n_q * n_k * d * d / M + 8 * n_q * n_k * d / M) + 7 * n_q * d)

    backward = Algorithm(
        name=f"{name} backward", run=backward_run, tensors=flash_backward.TENSORS, outer="Bc",
        working_set=flash_backward.working_set, traffic=backward_traffic, paper_form=backward_paper_form,
        paper_label="s(20N²d²/M + 8N²d/M) + 7Nd", flops=backward_flops, needs=Needs(block_mask=True, window=True),
    )
    return Algorithm(
        name=name, run=run, tensors=flash.TENSORS, outer="Bc", working_set=flash.working_set, traffic=traffic,
        paper_form=paper_form, paper_label="s(12N²d²/M + 16N²d/M) + 3Nd", backward=backward, flops=flops,
        needs=Needs(block_mask=True, window=True),
    )


ALGORITHM = variant("block-sparse", skips_empty_columns=False)
