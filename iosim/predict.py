"""Exact closed-form HBM traffic and SRAM working sets, one pair per algorithm.

Each count is per batch·head and is multiplied by bh at the end. The derivations
are in docs/derivations.md; tests hold every count equal to the simulator's.
Notation: T_r = ⌈N_q / B_r⌉, T_c = ⌈N_k / B_c⌉, and "mask" is 1 when an explicit
boolean mask is read from HBM.
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


def _scaled(pb: Problem, reads: dict[str, int], writes: dict[str, int], peak: int) -> Prediction:
    bh = pb.shape.bh
    if pb.has_mask:
        reads["mask"] = pb.shape.n_q * pb.shape.n_k  # every (i, j) tile of the mask, once
    return Prediction({k: v * bh for k, v in reads.items()}, {k: v * bh for k, v in writes.items()}, peak)


# --- flash: Algorithm 1/2 -------------------------------------------------------------
def flash_working_set(pb: Problem, Br: int, Bc: int, M: int) -> int:
    # K_j, V_j + Q_i, O_i + S_ij + (ℓ_i, m_i, m̃, ℓ̃, m_new, ℓ_new) [+ mask tile]
    return 2 * Bc * pb.shape.d + 2 * Br * pb.shape.d + Br * Bc + 6 * Br + pb.has_mask * Br * Bc


def flash_traffic(pb: Problem, Br: int, Bc: int, M: int) -> Prediction:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    Tc = ceil_div(n_k, Bc)
    reads = {
        "Q": Tc * n_q * d,  # Q_i re-read in every outer iteration (line 9)
        "K": n_k * d, "V": n_k * d,  # K_j, V_j read once (line 7)
        "O": Tc * n_q * d, "l": Tc * n_q, "m": Tc * n_q,  # line 9
    }
    writes = {
        "O": Tc * n_q * d + n_q * d,  # line 15 per step, plus the zeros of line 3
        "l": Tc * n_q + n_q, "m": Tc * n_q + n_q,  # line 16, plus line 3
    }
    return _scaled(pb, reads, writes, flash_working_set(pb, Br, Bc, M))


# --- flash-swapped: Q blocks outer ------------------------------------------------------
def swapped_working_set(pb: Problem, Br: int, Bc: int, M: int) -> int:
    # Q_i, O_i + K_j, V_j + S_ij + (ℓ_i, m_i, m_new, ℓ̃) [+ mask tile]
    return 2 * Br * pb.shape.d + 2 * Bc * pb.shape.d + Br * Bc + 4 * Br + pb.has_mask * Br * Bc


def swapped_traffic(pb: Problem, Br: int, Bc: int, M: int) -> Prediction:
    n_q, n_k, d = pb.shape.n_q, pb.shape.n_k, pb.shape.d
    Tr = ceil_div(n_q, Br)
    reads = {"Q": n_q * d, "K": Tr * n_k * d, "V": Tr * n_k * d}  # K, V once per query block
    writes = {"O": n_q * d, "l": n_q, "m": n_q}  # each written once
    return _scaled(pb, reads, writes, swapped_working_set(pb, Br, Bc, M))


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
    return _scaled(pb, reads, writes, standard_working_set(pb, Br, Bc, M))


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
