"""Exact closed-form HBM traffic and SRAM working sets, one pair per algorithm.

Each count is per batch·head and is multiplied by bh at the end. The derivations
are in docs/derivations.md; tests hold every count equal to the simulator's.
Notation: T_r = ⌈N_q / B_r⌉, T_c = ⌈N_k / B_c⌉. The FlashAttention variants skip
block pairs that a causal mask hides entirely; ``visible_blocks`` sums what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.algorithms.standard import softmax_rows
from iosim.problem import Problem


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Prediction:
    """Predicted element counts per tensor, summed over batch·heads, and the peak SRAM per head."""

    reads: dict[str, int]
    writes: dict[str, int]
    peak_sram: int

    @property
    def total(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())

    def total_bytes(self, pb: Problem) -> int:
        return sum((self.reads.get(n, 0) + self.writes.get(n, 0)) * pb.itemsize_of(n)
                   for n in set(self.reads) | set(self.writes))


@dataclass(frozen=True)
class VisibleBlocks:
    """Sums over the (i, j) block pairs an algorithm visits; all pairs without a causal skip."""

    rows: int  # Σ b_i: query rows met by key blocks (T_c·N_q without a skip)
    cols: int  # Σ b_j: key rows met by query blocks (T_r·N_k without a skip)
    area: int  # Σ b_i·b_j: elements of the visited tiles (N_q·N_k without a skip)


def visible_blocks(pb: Problem, Br: int, Bc: int, skip_causal: bool) -> VisibleBlocks:
    """The block pairs left after skipping those a causal mask hides entirely.

    Query block i (rows r0 … r0 + b_i − 1) sees keys up to L_i = r0 + b_i − 1 + N_k − N_q,
    so it meets the key blocks j ≤ ⌊L_i / B_c⌋: min(T_c, ⌊L_i / B_c⌋ + 1) of them (none
    when L_i < 0), covering min(N_k, that count · B_c) key rows.
    """
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    Tr, Tc = ceil_div(n_q, Br), ceil_div(n_k, Bc)
    if not (pb.causal and skip_causal):
        return VisibleBlocks(Tc * n_q, Tr * n_k, n_q * n_k)
    rows = cols = area = 0
    for r0 in range(0, n_q, Br):
        b_i = min(Br, n_q - r0)
        last_key = r0 + b_i - 1 + n_k - n_q
        if last_key < 0:
            continue
        n_blocks = min(Tc, last_key // Bc + 1)
        key_rows = min(n_k, n_blocks * Bc)
        rows, cols, area = rows + b_i * n_blocks, cols + key_rows, area + b_i * key_rows
    return VisibleBlocks(rows, cols, area)


def _scaled(pb: Problem, reads: dict[str, int], writes: dict[str, int], peak: int, mask_reads: int) -> Prediction:
    bh = pb.shape.bh
    if pb.has_mask:
        reads["mask"] = mask_reads  # every visited (i, j) tile of the mask, once
    return Prediction({k: v * bh for k, v in reads.items()}, {k: v * bh for k, v in writes.items()}, peak)


# --- flash: Algorithm 1/2 -------------------------------------------------------------
def flash_working_set(pb: Problem, Br: int, Bc: int, M: int) -> int:
    # K_j, V_j + Q_i, O_i + S_ij + (ℓ_i, m_i, m̃, ℓ̃, m_new, ℓ_new) [+ mask tile]
    return 2 * Bc * pb.shape.d + 2 * Br * pb.shape.d + Br * Bc + 6 * Br + pb.has_mask * Br * Bc


def _block_sizes(n: int, B: int, start: int) -> set[int]:
    """Sizes of the blocks start … T − 1 of range(n) split by B: B and/or the ragged n mod B."""
    sizes = {B} if n // B > start else set()
    if n % B and -(-n // B) - 1 >= start:
        sizes.add(n % B)
    return sizes


def flash_peak(pb: Problem, Br: int, Bc: int, M: int) -> int:
    """Peak SRAM: the working set, or with a causal skip the largest over the visited pairs.

    Key block j (first key j·B_c) meets query blocks from ⌊max(0, j·B_c − (N_k − N_q)) / B_r⌋
    on; line 3's initialization holds one B_r × d tile.
    """
    if not pb.causal:
        return flash_working_set(pb, Br, Bc, M)
    n_q, n_k = pb.shape.n_q, pb.shape.n_k
    peak = Br * pb.shape.d
    for j0 in range(0, n_k, Bc):
        first = max(0, j0 - (n_k - n_q)) // Br
        for b_i in _block_sizes(n_q, Br, first):
            peak = max(peak, flash_working_set(pb, b_i, min(Bc, n_k - j0), M))
    return peak


def flash_traffic(pb: Problem, Br: int, Bc: int, M: int) -> Prediction:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    vis = visible_blocks(pb, Br, Bc, skip_causal=True)  # vis.rows = T_c·N_q without a causal skip
    reads = {
        "Q": vis.rows * d,  # Q_i re-read in every outer iteration that meets it (line 9)
        "K": n_k * d, "V": n_k * d,  # K_j, V_j read once (line 7)
        "O": vis.rows * d, "l": vis.rows, "m": vis.rows,  # line 9
    }
    writes = {
        "O": vis.rows * d + n_q * d,  # line 15 per step, plus the zeros of line 3
        "l": vis.rows + n_q, "m": vis.rows + n_q,  # line 16, plus line 3
    }
    return _scaled(pb, reads, writes, flash_peak(pb, Br, Bc, M), vis.area)


# --- flash-swapped: Q blocks outer ------------------------------------------------------
def swapped_working_set(pb: Problem, Br: int, Bc: int, M: int) -> int:
    # Q_i, O_i + K_j, V_j + S_ij + (ℓ_i, m_i, m_new, ℓ̃) [+ mask tile]
    return 2 * Br * pb.shape.d + 2 * Bc * pb.shape.d + Br * Bc + 4 * Br + pb.has_mask * Br * Bc


def swapped_peak(pb: Problem, Br: int, Bc: int, M: int) -> int:
    """Peak SRAM: the working set, or with a causal skip the largest over the query blocks.

    A query block that meets a key block meets the first, full one; one that meets none
    holds only Q_i, O_i, ℓ_i, m_i.
    """
    if not pb.causal:
        return swapped_working_set(pb, Br, Bc, M)
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    peak = 0
    for r0 in range(0, n_q, Br):
        b_i = min(Br, n_q - r0)
        sees_keys = r0 + b_i - 1 + n_k - n_q >= 0
        peak = max(peak, swapped_working_set(pb, b_i, Bc, M) if sees_keys else 2 * b_i * d + 2 * b_i)
    return peak


def swapped_traffic(pb: Problem, Br: int, Bc: int, M: int) -> Prediction:
    n_q, d = pb.shape.n_q, pb.shape.d
    vis = visible_blocks(pb, Br, Bc, skip_causal=True)  # vis.cols = T_r·N_k without a causal skip
    reads = {"Q": n_q * d, "K": vis.cols * d, "V": vis.cols * d}  # K, V once per query block meeting them
    writes = {"O": n_q * d, "l": n_q, "m": n_q}  # each written once
    return _scaled(pb, reads, writes, swapped_peak(pb, Br, Bc, M), vis.area)


# --- standard: Algorithm 0 ---------------------------------------------------------------
def standard_working_set(pb: Problem, Br: int, Bc: int, M: int) -> int:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    step1 = Br * d + Bc * d + Br * Bc + pb.has_mask * Br * Bc  # Q_i, K_j, S_ij [, mask]
    R = softmax_rows(M, n_q, n_k)
    step2 = R * (n_k + 2) if R >= 1 else Br * Bc + 4 * Br  # rows of S with m, ℓ; or two-pass
    step3 = Br * d + Br * Bc + Bc * d  # O_i, P_ij, V_j
    return max(step1, step2, step3)


def standard_traffic(pb: Problem, Br: int, Bc: int, M: int) -> Prediction:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    Tr = ceil_div(n_q, Br)
    passes = 1 if softmax_rows(M, n_q, n_k) >= 1 else 2
    reads = {
        "Q": n_q * d, "K": Tr * n_k * d,  # step 1: K streamed once per query block
        "S": passes * n_q * n_k,  # step 2
        "P": n_q * n_k, "V": Tr * n_k * d,  # step 3: V streamed once per query block
    }
    writes = {"S": n_q * n_k, "P": n_q * n_k, "O": n_q * d}
    return _scaled(pb, reads, writes, standard_working_set(pb, Br, Bc, M), n_q * n_k)


# --- the paper's and seed's asymptotic forms ----------------------------------------------
# Shown with N² ↦ N_q·N_k and N ↦ N_q (so they read as printed when N_q = N_k = N).
def flash_paper_form(pb: Problem, M: int) -> float:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (12 * n_q * n_k * d * d / M + 16 * n_q * n_k * d / M + 3 * n_q * d)


def swapped_paper_form(pb: Problem, M: int) -> float:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (8 * n_q * n_k * d * d / M + 3 * d * n_q + 2 * n_q)


def standard_paper_form(pb: Problem, M: int) -> float:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    return pb.shape.bh * (n_q * d + n_q * n_k)
