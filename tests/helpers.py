"""Shared builders for the simulator tests, and a loader of the examples outside the package."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import iosim
from iosim.core.problem import AttentionShape, Problem
from iosim.registry import ALGORITHMS
from iosim.tilings.policies import shape_rule

REPO = Path(__file__).resolve().parents[1]
# flex runs over a FlexAttention block mask, which these shared strategies do not make: tests/test_flex.py holds it
ALGORITHM_NAMES = [name for name, a in ALGORITHMS.items() if not a.accepts("block_mask")]
# the algorithms with a backward pass (small-cache, for one, has none: --pass bwd refuses it)
BACKWARD_NAMES = [name for name in ALGORITHM_NAMES if ALGORITHMS[name].backward is not None]


def load_file(name: str, path: Path):
    """The module in `path` (an example outside the package), registered as sys.modules[name]."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def kv_resident_example():
    """docs/examples/kv_resident.py's algorithm: the architecture example, which has no backward pass."""
    return load_file("kv_resident", REPO / "docs" / "examples" / "kv_resident.py").KV_RESIDENT


def random_qkv(rng: np.random.Generator, batch: int, heads: int, n_q: int, n_k: int, d: int, d_v: int | None = None):
    """q, k of head size d and v of d_v (None: d), standard normal."""
    q = rng.standard_normal((batch, heads, n_q, d))
    k = rng.standard_normal((batch, heads, n_k, d))
    v = rng.standard_normal((batch, heads, n_k, d if d_v is None else d_v))
    return q, k, v


def problem(n_q: int, n_k: int, d: int, *, bh: int = 1, has_mask: bool = False, d_v: int | None = None) -> Problem:
    return Problem(AttentionShape(1, bh, n_q, n_k, d, d_v=d_v), tau=1.0, has_mask=has_mask)


def M_for_block(algorithm: str, n_q: int, n_k: int, d: int, B: int, has_mask: bool = False) -> int:
    """The smallest M whose 'fit' blocks have outer block B: tests pick tilings through it."""
    algo = ALGORITHMS[algorithm]
    pb = problem(n_q, n_k, d, has_mask=has_mask)
    tiling = shape_rule(algo, pb, B)
    M = algo.working_set(pb, tiling, 10**12)
    while algo.working_set(pb, tiling, M) > M:  # a working set may grow with M (standard's softmax rows)
        M += 1
    return M


def relative_error(x: np.ndarray, ref: np.ndarray) -> float:
    """max |x − ref| / max(1, max |ref|)."""
    return float(np.max(np.abs(x - ref)) / max(1.0, float(np.max(np.abs(ref)))))


# --- hand-derived count cases (tests/test_counts_by_hand.py, tests/test_backward_counts_by_hand.py) ---
BIG_M = 10**6  # for the hand cases: M does not enter a count once the tiling fits (standard's softmax aside)
# a block mask over 3 query blocks × 4 key blocks (the block-sparse hand cases)
SPARSE = iosim.BlockSparsity.from_array(np.array([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=bool))


@dataclass(frozen=True)
class Hand:
    id: str
    algorithm: str
    Br: int
    Bc: int
    shape: dict  # N, N_k, d, M, and optionally batch, heads, causal, mask, dropout_p
    reads: dict[str, int]
    writes: dict[str, int]
    peak: int
    splits: int = 1  # K/V splits (split-kv)

    @property
    def tiling(self) -> iosim.Tiling:
        return iosim.Tiling(Br=self.Br, Bc=self.Bc, splits=self.splits)

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.reads, *self.writes]))


def assert_counts_equal_hand(case: Hand, counts, source: str):
    for name in case.tensors:
        t = counts.tensor(name)
        want_r, want_w = case.reads.get(name, 0), case.writes.get(name, 0)
        assert (t.reads, t.writes) == (want_r, want_w), (
            f"{case.id} {source}: {name} reads, writes = {t.reads}, {t.writes}; by hand {want_r}, {want_w}"
        )
    # no tensor outside the table moves anything
    assert (counts.reads, counts.writes) == (sum(case.reads.values()), sum(case.writes.values())), (
        f"{case.id} {source}: total reads, writes = {counts.reads}, {counts.writes}; "
        f"by hand {sum(case.reads.values())}, {sum(case.writes.values())}"
    )
    assert counts.peak_sram == case.peak, f"{case.id} {source}: peak SRAM {counts.peak_sram}, by hand {case.peak}"
