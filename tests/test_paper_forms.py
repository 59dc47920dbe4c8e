"""The paper's asymptotic forms, pinned: Theorem 2 (forward), Theorem 5 (backward) and the seeds' forms.

Each algorithm's ``paper_form`` is held to a formula written here from the papers and
docs/derivations.md, and the FlashAttention family's forms to the exact counts: a form
counts the paper's loop at the paper's blocks, B = M/4d (Alg. 1 line 1), so at blocks that
divide N the simulator must measure the form exactly, up to the linear terms that
docs/derivations.md names, and with a ragged last block the ceiling of T adds a fraction
of one outer iteration. A wrong constant (Alg. 4's 20N²d²/M as 12) fails both.
"""

from __future__ import annotations

import math

import pytest

import iosim
from iosim.api import count_problem
from iosim.core.problem import Problem
from iosim.registry import ALGORITHMS


def algorithm(name: str, pass_: str):
    return ALGORITHMS[name] if pass_ == "fwd" else ALGORITHMS[name].backward


# (quadratic, N²d/M, N·d, N): the form a·N²d²/M + b·N²d/M + c·N·d + e·N per head, the N² terms scaled by s.
FORMS = {
    ("flash", "fwd"): (12, 16, 3, 0),  # Theorem 2 as seed 003 counts Alg. 1
    ("flash", "bwd"): (20, 8, 7, 0),  # Theorem 5, Alg. 4: T_c·N·(5d + 2) + 7Nd
    ("flash-swapped", "fwd"): (8, 0, 3, 2),  # seed 003's "possible improvement", Q blocks outer
    ("flash-swapped", "bwd"): (16, 8, 7, 4),  # FlashAttention-2's backward: T_c·N·(4d + 2) + 7Nd + 4N
    ("block-sparse", "fwd"): (12, 16, 3, 0),  # section 3.3: s·(Theorem 2's inner steps) + 3Nd
    ("block-sparse", "bwd"): (20, 8, 7, 0),  # Alg. 4 with its inner steps scaled by s
    ("block-sparse-skip", "fwd"): (12, 16, 3, 0),
    ("block-sparse-skip", "bwd"): (20, 8, 7, 0),
}


def form(key: tuple[str, str], pb: Problem, M: int, s: float = 1.0) -> float:
    a, b, c, e = FORMS[key]
    n_q, n_k, d, bh = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.bh
    return bh * (s * (a * n_q * n_k * d * d / M + b * n_q * n_k * d / M) + c * n_q * d + e * n_q)


def theta_form(name: str, pb: Problem, M: int) -> float:
    """Theorems 2 and 5 for standard attention, Θ(Nd + N²); Saha and Ye's Θ(N²d/√M); the decode cache."""
    n_q, n_k, d, bh = pb.shape.n_q, pb.shape.n_k, pb.shape.d, pb.shape.bh
    if name in ("standard", "standard-eager"):
        return bh * (n_q * d + n_q * n_k)
    if name == "small-cache":
        return bh * n_q * n_k * d / math.sqrt(M)
    raise KeyError(name)


# What the exact count adds to the form at the paper's blocks (docs/derivations.md), and what one outer
# iteration moves, per head, which a ragged last block adds a fraction of.
def linear_difference(key: tuple[str, str], N: int, d: int) -> int:
    return {
        ("flash", "fwd"): 2 * N,  # line 3 initializes ℓ and m, which the seed leaves out
        ("flash-swapped", "fwd"): -N * d,  # the seed reads O_i per outer iteration; this order starts it on chip
        ("block-sparse", "fwd"): 2 * N, ("block-sparse-skip", "fwd"): 2 * N,
    }.get(key, 0)


def per_outer_iteration(key: tuple[str, str], N: int, d: int, s: float = 1.0) -> float:
    return s * {"fwd": {"flash-swapped": 2 * N * d}.get(key[0], 3 * N * d + 4 * N),  # Alg. 1 lines 9, 15–16
                "bwd": {"flash-swapped": N * (4 * d + 2)}.get(key[0], N * (5 * d + 2))}[key[1]]  # Alg. 4 10, 21


def paper_tiling(key: tuple[str, str], B: int, d: int) -> iosim.Tiling:
    """B on the block whose count T the form has (B_r for the swapped forward, B_c otherwise), d on the other."""
    return iosim.Tiling(B, d) if key == ("flash-swapped", "fwd") else iosim.Tiling(d, B)


# (N, d, B): B divides N, M = 4·d·B; d odd, N not a power of two.
DIVIDING = [(4096, 64, 256), (1155, 7, 105), (1536, 24, 96)]
BATCH, HEADS = 2, 3


@pytest.mark.parametrize("N, d, B", DIVIDING)
@pytest.mark.parametrize("key", sorted(FORMS), ids="-".join)
def test_flash_forms_are_the_exact_count_at_the_papers_blocks(key, N, d, B):
    M = 4 * d * B  # the paper's B_c = M/4d
    r = iosim.count(key[0], pass_=key[1], N=N, d=d, batch=BATCH, heads=HEADS, M=10**9,
                    tiling=paper_tiling(key, B, d))
    assert algorithm(*key).paper_form(r.problem, M) == pytest.approx(form(key, r.problem, M), rel=1e-12)
    expected = form(key, r.problem, M) + BATCH * HEADS * linear_difference(key, N, d)
    assert r.traffic.total == pytest.approx(expected, rel=1e-12), (
        f"{key} N={N} d={d} M={M}: counted {r.traffic.total}, form + linear terms {expected}")


@pytest.mark.parametrize("N, d, B", [(4099, 64, 256), (1000, 7, 105), (239, 24, 96)])
@pytest.mark.parametrize("key", sorted(FORMS), ids="-".join)
def test_a_ragged_block_adds_a_fraction_of_one_outer_iteration(key, N, d, B):
    M = 4 * d * B
    r = iosim.count(key[0], pass_=key[1], N=N, d=d, M=10**9, tiling=paper_tiling(key, B, d))
    excess = math.ceil(N / B) - N / B  # T = ⌈N/B⌉ against the form's N/B
    expected = form(key, r.problem, M) + linear_difference(key, N, d) + excess * per_outer_iteration(key, N, d)
    assert r.traffic.total == pytest.approx(expected, rel=1e-12), f"{key} N={N}: {r.traffic.total} != {expected}"


@pytest.mark.parametrize("pattern", ["local", "strided"])
@pytest.mark.parametrize("key", [k for k in sorted(FORMS) if k[0].startswith("block-sparse")], ids="-".join)
def test_block_sparse_forms_scale_the_inner_steps_by_s(key, pattern):
    # T_r = 1536/24 = 64, T_c = 16: s = 1/4 gives exactly 256 nonzero tiles, every key block among them
    N, d, B, s = 1536, 24, 96, 0.25
    M = 4 * d * B
    sparsity = iosim.BlockSparsity(s, pattern)
    r = iosim.count(key[0], pass_=key[1], N=N, d=d, M=10**9, tiling=iosim.Tiling(d, B), block_sparsity=sparsity)
    blocks = sparsity.mask(N // d, N // B)
    assert blocks.sum() == s * blocks.size and blocks.any(axis=0).all(), "the pattern must load every key block"
    assert algorithm(*key).paper_form(r.problem, M) == pytest.approx(form(key, r.problem, M, s), rel=1e-12)
    expected = form(key, r.problem, M, s) + linear_difference(key, N, d)
    assert r.traffic.total == pytest.approx(expected, rel=1e-12), f"{key} {pattern}: {r.traffic.total} != {expected}"


@pytest.mark.parametrize("name", ["standard", "standard-eager", "small-cache"])
@pytest.mark.parametrize("N, N_k, d, M", [(113, 239, 7, 5000), (4096, 4096, 64, 100_000), (1, 1023, 33, 777)])
def test_theta_forms_are_the_papers(name, N, N_k, d, M):
    pb = count_problem(N, d, N_k, batch=BATCH, heads=HEADS)
    assert ALGORITHMS[name].paper_form(pb, M) == pytest.approx(theta_form(name, pb, M), rel=1e-12)
    if ALGORITHMS[name].backward is not None:  # Theorem 5 gives the backward the forward's Θ(Nd + N²)
        assert ALGORITHMS[name].backward.paper_form(pb, M) == pytest.approx(theta_form(name, pb, M), rel=1e-12)


def test_split_kv_form_is_the_cache_read_once_per_kv_head():
    # decoding: 8 query heads share 2 K/V heads; the cache 2·N_k·d per K/V head, q read and o written per head
    N, N_k, d, batch, heads, kv_heads = 3, 5000, 64, 2, 8, 2
    p = iosim.predict("split-kv", N=N, N_k=N_k, d=d, batch=batch, heads=heads, kv_heads=kv_heads, M=50_000)
    assert p.paper == 2 * N_k * d * batch * kv_heads + 2 * N * d * batch * heads


@pytest.mark.parametrize("pass_, limit", [("fwd", 6), ("bwd", 11)])
def test_standard_over_its_theta_form_tends_to_the_documented_constant(pass_, limit):
    # At B_r = B_c = d with whole rows of S on chip, docs/derivations.md gives (3 + 1)·N² + 2·N² + 2·N·d forward
    # (S, P, and K, V re-read T_r times) and 7·N² + 2·N² + 2·N² + 6·N·d backward: over N² + N·d, 6 and 11.
    d = 16
    for N in (100, 1000, 10_000):
        r = iosim.count("standard", pass_=pass_, N=N, d=d, M=10**9, tiling=iosim.Tiling(d, d))
        ratio = r.traffic.total / algorithm("standard", pass_).paper_form(r.problem, r.M)
        assert abs(ratio - limit) <= 2 * limit * d / N, f"N={N}: ratio {ratio:.4f}, limit {limit}"
