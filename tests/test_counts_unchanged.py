"""Every count, peak, FLOP figure, tiling and refusal over a wide grid, held to what they were before a restructuring.

The expected file, ``tests/data/counts_grid.json``, was written by this module at the
commit it names, before the second structure pass (issue 16) moved any code; the test
recomputes the grid through the public API and compares entry by entry. A change of the
counts is then a deliberate act: regenerate with

    python tests/test_counts_unchanged.py --write

and say in the commit why the counts changed.
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import iosim

DATA = Path(__file__).parent / "data" / "counts_grid.json"

SHAPES = [  # (N_q, N_k, d): awkward sizes, N_q != N_k both ways, decoding, and counts far past any array
    (1, 1, 8), (113, 113, 16), (239, 100, 24), (64, 300, 64), (1, 4096, 128), (4096, 4096, 64), (10**6, 10**6, 128),
]
SMALL = SHAPES[:4]  # where block masks and explicit masks are cheap
MEMORIES = ("20k", "100k", "192KiB")
POLICIES = ("fit", "paper", "optimal")
PASSES = ("fwd", "bwd", "fwd+bwd")


def cases() -> list[dict]:
    """The grid: every algorithm, pass, policy and M on every shape, causal or not, and the options on small shapes."""
    out = []
    for algo, pass_, (n, n_k, d), causal, M, policy in itertools.product(
            sorted(iosim.ALGORITHMS), PASSES, SHAPES, (False, True), MEMORIES, POLICIES):
        if policy == "optimal" and (causal and n * n_k > 10**6 or M == "192KiB"):
            continue  # the causal search is O(M/d) closed forms: keep the grid quick
        out.append(dict(algorithm=algo, pass_=pass_, N=n, N_k=n_k, d=d, causal=causal, M=M, block_policy=policy))
    for algo, pass_, (n, n_k, d), causal in itertools.product(sorted(iosim.ALGORITHMS), PASSES, SMALL,
                                                              (False, True)):
        base = dict(algorithm=algo, pass_=pass_, N=n, N_k=n_k, d=d, causal=causal, M="20k", block_policy="fit")
        out += [{**base, "mask": True}, {**base, "dropout_p": 0.1}, {**base, "batch": 2, "heads": 4},
                {**base, "batch": 2, "heads": 4, "kv_heads": 2}, {**base, "heads": 6, "kv_heads": 1},
                {**base, "splits": 3}, {**base, "splits": 1}, {**base, "dtype": "float32"},
                {**base, "tiling": (7, 5)}, {**base, "tiling": (64, 64)}]
        for s, pattern, seed in (("0.3", "local", 0), ("0.5", "random", 3), ("0.25", "strided", 0)):
            for policy in ("fit", "optimal"):
                out.append({**base, "block_policy": policy,
                            "block_sparsity": dict(sparsity=float(s), pattern=pattern, seed=seed)})
    return out


def _kwargs(case: dict) -> dict:
    kw = {k: v for k, v in case.items() if k not in ("algorithm", "tiling", "block_sparsity")}
    if "tiling" in case:
        kw["tiling"] = iosim.Tiling(*case["tiling"])
    if "block_sparsity" in case:
        kw["block_sparsity"] = iosim.BlockSparsity(**case["block_sparsity"])
    return kw


def _tiling(t) -> list | None:
    return None if t is None else [t.Br, t.Bc, t.splits]


def _tilings(result) -> tuple[list | None, list | None]:
    """The grid's two tiling keys, as written at 815f537: "tiling" is the last pass's (the backward's when it ran),
    "forward_tiling" the forward's when both passes ran, else None."""
    two = result.forward_tiling is not None and result.backward_tiling is not None
    return _tiling(result.backward_tiling or result.forward_tiling), _tiling(result.forward_tiling if two else None)


def outcome(case: dict) -> dict:
    """What count and predict give for one case: counts, peak, FLOPs and tilings, or the refusal."""
    kw = _kwargs(case)
    try:
        measured = iosim.count(case["algorithm"], **kw)
        predicted = iosim.predict(case["algorithm"], **{k: v for k, v in kw.items() if k != "seed"})
    except (iosim.InputError, iosim.CapacityError) as err:
        return {"refused": type(err).__name__, "message": str(err)}
    t = measured.traffic
    last, forward = _tilings(measured)
    return {
        "M": measured.M, "tiling": last, "forward_tiling": forward,
        "tensors": [[x.name, x.reads, x.writes, x.itemsize] for x in t.tensors], "peak_sram": t.peak_sram,
        "flops": None if measured.flops is None else [measured.flops.matmul, measured.flops.exp],
        "predicted_equal": predicted.exact == t, "paper": predicted.paper, "paper_label": predicted.paper_label,
        "predicted_flops": None if predicted.flops is None else [predicted.flops.matmul, predicted.flops.exp],
        "predicted_tiling": _tilings(predicted)[0],
    }


def _key(case: dict) -> str:
    return json.dumps(case, sort_keys=True)


def _grid() -> dict[str, dict]:
    return {_key(case): outcome(case) for case in cases()}


@functools.cache
def expected_grid() -> dict[str, dict]:
    """The committed grid, read once per test process (3 MB of JSON)."""
    return json.loads(DATA.read_text())["grid"]


def test_the_grid_holds_the_same_cases():
    expected = expected_grid()
    got = {_key(case) for case in cases()}
    assert got == set(expected), (f"the grid's cases changed: {len(got - set(expected))} new, "
                                  f"{len(set(expected) - got)} gone")
    assert sum("refused" in x for x in expected.values()) > 100  # the grid holds refusals as well as counts
    assert sum("refused" not in x for x in expected.values()) > 2000


# One test per algorithm and shape, so that the workers share the grid. Most of its time is the optimal policy with
# a block mask (72 rows each of block-sparse and block-sparse-skip, about 20 s each on CI's machine): the mask is
# drawn on each tiling's own tiles, so the search evaluates every tiling that fits (2,000 to 17,000 per problem and
# pass at M = 20k on the three larger small shapes, about 0.06 ms each). Nothing is searched twice: count and
# predict, and fwd+bwd after fwd and bwd, reuse a search (iosim.tilings.search.ranked's cache), which a shape's
# test keeps in one process.
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("algorithm", sorted(iosim.ALGORITHMS))
def test_every_count_peak_flop_and_refusal_is_what_it_was(algorithm, shape):
    expected = expected_grid()
    got = {_key(case): outcome(case) for case in cases()
           if case["algorithm"] == algorithm and (case["N"], case["N_k"], case["d"]) == shape}
    assert got, f"the grid has no case of {algorithm} at N_q, N_k, d = {shape}"
    changed = [key for key in got if got[key] != expected.get(key)]
    assert not changed, (f"{len(changed)} of {len(got)} cases of {algorithm} at {shape} changed; the first: "
                         f"{changed[0]}\nwas {expected.get(changed[0])}\nnow {got[changed[0]]}")


def write() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps({"commit": commit, "grid": _grid()}, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_counts_unchanged.py --write")
    write()
