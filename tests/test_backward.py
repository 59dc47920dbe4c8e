"""Backward passes: gradients equal float64 attention's, and measured traffic equals the closed form."""

import numpy as np
import pytest
from helpers import BACKWARD_NAMES, problem, random_qkv, relative_error
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import iosim
from iosim.tilings.policies import choose_tiling

TOL = 1e-10  # both sides compute in float64; only the order of summation differs


def smallest_M(algorithm, n_q, n_k, d, masked, passes=("fwd", "bwd"), d_v=None):
    """The least M that ``passes`` of ``algorithm`` run in: their working sets with one-row blocks."""
    forward = iosim.ALGORITHMS[algorithm]
    pb = problem(n_q, n_k, d, has_mask=masked, d_v=d_v)
    algos = {"fwd": forward, "bwd": forward.backward}
    return max(algos[p].working_set(pb, iosim.Tiling(1, 1), 0) for p in passes)


@st.composite
def count_cases(draw):
    d = draw(st.integers(1, 256))
    d_v = draw(st.one_of(st.just(d), st.integers(1, 256)))  # V's head size, apart from Q's and K's (MLA)
    n_q = draw(st.integers(1, 70000))
    n_k = draw(st.one_of(st.just(n_q), st.integers(1, 70000)))
    return dict(N=n_q, N_k=n_k, d=d, d_v=d_v, M=draw(st.integers(4 * (d + d_v) + 10, 4_000_000)),
                batch=draw(st.integers(1, 4)),
                heads=draw(st.integers(1, 16)), causal=draw(st.booleans()), mask=draw(st.booleans()),
                dropout_p=draw(st.sampled_from([0.0, 0.3])), dtype=draw(st.sampled_from(["float16", "float32"])))


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
@settings(max_examples=200, deadline=None)
@given(c=count_cases())
def test_backward_count_equals_exact_prediction(algorithm, c):
    try:
        r = iosim.count(algorithm, pass_="bwd", **c)
    except iosim.BlockSizeError:  # M below this shape's smallest backward working set
        assert c["M"] < smallest_M(algorithm, c["N"], c["N_k"], c["d"], c["mask"], passes=("bwd",), d_v=c["d_v"])
        reject()
    pred = iosim.predict(algorithm, pass_="bwd", **c)
    assert pred.tiling == r.tiling
    assert r.traffic == pred.exact, f"{algorithm} {c}: {r.traffic} != {pred.exact}"
    assert r.traffic.peak_sram <= r.M


@st.composite
def gradient_cases(draw):
    n_q = draw(st.sampled_from([1, 2, 17, 113, 239]))
    n_k = draw(st.sampled_from([1, 3, 64, 113, 239]))
    d = draw(st.sampled_from([1, 5, 16, 33]))
    d_v = draw(st.sampled_from([d, d, 1, 7, 24]))  # V's head size, apart from Q's and K's half the time (MLA)
    masked = draw(st.booleans())
    # Numeric mode takes a Python step per tile (about 6 s for 239 × 239 tiles of 1 × 1): the smallest M, whose
    # blocks are 1 × 1, only up to 113 × 64 tiles; above, M_extra >= (N_q + N_k)·d leaves room for larger blocks.
    least_extra = 0 if n_q * n_k <= 113 * 64 else (n_q + n_k) * max(d, d_v)
    return dict(
        n_q=n_q, n_k=n_k, d=d, d_v=d_v, masked=masked,
        M_extra=draw(st.integers(least_extra, 20 * (n_q + n_k) * max(d, d_v))),
        batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 3)), causal=draw(st.booleans()),
        scale=draw(st.sampled_from([None, 0.37, -1.5])), dropout_p=draw(st.sampled_from([0.0, 0.0, 0.25, 0.9])),
        seed=draw(st.integers(0, 2**64 - 1)),
    )


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=gradient_cases())
def test_gradients_match_float64_reference_and_their_counts(algorithm, c):
    rng = np.random.default_rng(c["seed"] % 2**32)
    q, k, v = random_qkv(rng, c["batch"], c["heads"], c["n_q"], c["n_k"], c["d"], c["d_v"])
    do = rng.standard_normal(q.shape[:3] + (c["d_v"],))
    mask = rng.random((c["heads"], c["n_q"], c["n_k"])) > 0.3 if c["masked"] else None
    M = smallest_M(algorithm, c["n_q"], c["n_k"], c["d"], c["masked"], d_v=c["d_v"]) + c["M_extra"]
    opts = dict(causal=c["causal"], mask=mask, scale=c["scale"], dropout_p=c["dropout_p"], seed=c["seed"])
    g = iosim.gradients(algorithm, q, k, v, do, M=M, **opts)
    ref = iosim.attention_backward_ref(q, k, v, do, **opts)
    for name, x, r in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), ref):
        assert x.shape == r.shape
        err = relative_error(x, r)
        assert err <= TOL, f"{algorithm} {c} blocks {g.backward_tiling}: {name} relative error {err:.3e} > {TOL}"
    shape = dict(N=c["n_q"], N_k=c["n_k"], d=c["d"], d_v=c["d_v"], M=M, batch=c["batch"], heads=c["heads"],
                 causal=c["causal"],
                 mask=c["masked"], dropout_p=c["dropout_p"])
    counted = iosim.count(algorithm, pass_="bwd", **shape)
    assert counted.tiling == g.backward_tiling and counted.traffic == g.traffic, (
        f"{algorithm} {c}: numeric != count-only"
    )
    assert counted.flops == g.flops, f"{algorithm} {c}: numeric and count-only arithmetic differ"
    assert g.traffic == iosim.predict(algorithm, pass_="bwd", **shape).exact
    forward = iosim.predict(
        algorithm, **shape, tiling=g.backward_tiling if iosim.ALGORITHMS[algorithm].step_shares_tiling else None
    )
    assert forward.tiling == g.forward_tiling and g.forward_traffic == forward.exact


def central_differences(f, x, eps=1e-6):
    """∂f/∂x by central differences, one element at a time."""
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (f(up) - f(down)) / (2 * eps)
    return grad


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
@pytest.mark.parametrize("n_q, n_k, d, causal, masked, dropout_p", [
    (1, 1, 1, False, False, 0.0), (3, 5, 2, True, False, 0.0), (5, 3, 3, True, True, 0.0), (4, 4, 2, False, True, 0.5),
])
def test_gradients_match_finite_differences(algorithm, n_q, n_k, d, causal, masked, dropout_p):
    rng = np.random.default_rng(n_q * 100 + n_k * 10 + d)
    q, k, v = random_qkv(rng, 1, 2, n_q, n_k, d)
    do = rng.standard_normal(q.shape)
    mask = rng.random((n_q, n_k)) > 0.4 if masked else None
    opts = dict(causal=causal, mask=mask, dropout_p=dropout_p, seed=11)

    def loss(q_, k_, v_):  # ⟨dO, O⟩, whose gradient in q, k, v is what the backward pass returns
        return float(np.sum(do * iosim.attention_ref(q_, k_, v_, **opts).out))

    M = smallest_M(algorithm, n_q, n_k, d, masked) + 50
    g = iosim.gradients(algorithm, q, k, v, do, M=M, **opts)
    numeric = (central_differences(lambda x: loss(x, k, v), q), central_differences(lambda x: loss(q, x, v), k),
               central_differences(lambda x: loss(q, k, x), v))
    for name, x, fd in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), numeric):
        err = relative_error(x, fd)
        assert err <= 1e-7, f"{algorithm}: {name} differs from central differences by {err:.3e}"


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
def test_fully_masked_rows_get_zero_gradients(algorithm):
    # causal with N_q > N_k: the first N_q − N_k query rows see no key (bottom-right alignment);
    # an explicit mask hides every key from row 33 as well
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, 1, 1, 40, 10, 8)
    do = rng.standard_normal(q.shape)
    mask = np.ones((40, 10), dtype=bool)
    mask[33] = False
    g = iosim.gradients(algorithm, q, k, v, do, M=3000, causal=True, mask=mask, dropout_p=0.2)
    assert np.all(g.dq[..., :30, :] == 0.0) and np.all(g.dq[..., 33, :] == 0.0)
    for name, x in (("dq", g.dq), ("dk", g.dk), ("dv", g.dv)):
        assert np.isfinite(x).all(), f"{algorithm}: {name} has non-finite entries"
    ref = iosim.attention_backward_ref(q, k, v, do, causal=True, mask=mask, dropout_p=0.2)
    assert max(relative_error(x, r) for x, r in zip((g.dq, g.dk, g.dv), ref)) <= TOL


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
def test_backward_blocks_are_chosen_for_the_backward_working_set(algorithm):
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 1, 1, 300, 300, 16)
    g = iosim.gradients(algorithm, q, k, v, rng.standard_normal(q.shape), M=4000)
    backward = iosim.ALGORITHMS[algorithm].backward
    assert g.traffic.peak_sram <= 4000 and g.forward_traffic.peak_sram <= 4000
    forward = iosim.ALGORITHMS[algorithm]
    assert g.backward_tiling == choose_tiling(backward, g.problem, 4000)
    # a block mask is defined on the tiles, so block-sparse runs both passes on the backward's
    shared = g.backward_tiling if forward.step_shares_tiling else None
    assert g.forward_tiling == choose_tiling(forward, g.problem, 4000, tiling=shared)


FLASH_BACKWARDS = [name for name in BACKWARD_NAMES if name.startswith(("flash", "block-sparse"))]


@pytest.mark.parametrize("algorithm", FLASH_BACKWARDS)
@pytest.mark.parametrize("N, d, M", [(1024, 64, "100k"), (4096, 96, "192KiB"), (239, 16, "20k"), (113, 7, 2000)])
def test_paper_blocks_never_fit_a_flash_backward_pass_past_M_over_4d(algorithm, N, d, M):
    # K_j, V_j, dK_j, dV_j alone take 4·B_c·d >= M at B_c = ⌈M/4d⌉ (Alg. 4 lines 5, 7): no room for Q_i, S_ij
    for pass_ in ("bwd", "fwd+bwd"):
        with pytest.raises(iosim.BlockSizeError) as refusal:
            iosim.count(algorithm, N=N, d=d, M=M, pass_=pass_, block_policy="paper")
        message = str(refusal.value)
        assert f"{algorithm} backward" in message and "'fit' or 'optimal'" in message, message
    forward = iosim.predict(algorithm, N=N, d=d, M=M, block_policy="paper")  # the forward's rule fits the forward
    outer = max(forward.tiling.Br, forward.tiling.Bc)  # B on the outer loop's block, min(B, d) on the other
    assert outer == min(N, -(-forward.M // (4 * d))), forward.tiling
    fit = iosim.count(algorithm, N=N, d=d, M=M, pass_="fwd+bwd", block_policy="fit")  # what the message offers
    assert fit.traffic.peak_sram <= fit.M


@pytest.mark.parametrize("algorithm", FLASH_BACKWARDS)
def test_paper_blocks_fit_a_flash_backward_pass_when_the_sequence_caps_them(algorithm):
    # N = 64 < M/4d = 313: B_c = N, and 4·64·16 + 4·16·16 + 2·16·64 + 3·16 = 7,216 elements fit M = 10,000
    r = iosim.count(algorithm, N=64, d=16, M=10_000, pass_="bwd", block_policy="paper")
    assert r.tiling == iosim.Tiling(16, 64), r.tiling


def test_a_pass_the_algorithm_lacks_is_refused():
    toy = iosim.Algorithm(name="toy-no-backward", run=iosim.ALGORITHMS["flash"].run,
                          tensors=iosim.ALGORITHMS["flash"].tensors, outer="Bc",
                          working_set=iosim.ALGORITHMS["flash"].working_set,
                          traffic=iosim.ALGORITHMS["flash"].traffic, paper_form=iosim.ALGORITHMS["flash"].paper_form,
                          paper_label="")
    with pytest.raises(iosim.InputError, match="toy-no-backward.*no backward pass"):
        iosim.count(toy, N=16, d=4, M=2000, pass_="bwd")
    q = np.ones((1, 1, 4, 2))
    with pytest.raises(iosim.InputError, match="no backward pass"):
        iosim.gradients(toy, q, q, q, q, M=2000)
    with pytest.raises(iosim.InputError, match=r"pass_='backward' is not one of \['fwd', 'bwd', 'fwd\+bwd'\]"):
        iosim.predict("flash", N=16, d=4, M=2000, pass_="backward")


@pytest.mark.parametrize("bad", [(1, 1, 4, 3), (1, 1, 5, 2), (1, 4, 2), (2, 1, 4, 2)])
def test_dO_of_the_wrong_shape_is_refused(bad):
    q = np.ones((1, 1, 4, 2))
    with pytest.raises(iosim.InputError, match=r"do must have shape \(1, 1, 4, 2\)"):
        iosim.gradients("flash", q, q, q, np.ones(bad), M=2000)


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
def test_a_training_step_is_both_passes_added(algorithm):
    shape = dict(N=1000, N_k=700, d=48, M="60k", causal=True, mask=True, batch=2)
    step, pred = iosim.count(algorithm, pass_="fwd+bwd", **shape), iosim.predict(algorithm, pass_="fwd+bwd", **shape)
    fwd = iosim.count(algorithm, tiling=step.forward_tiling, **shape)
    bwd = iosim.count(algorithm, pass_="bwd", **shape)
    assert step.backward_tiling == bwd.tiling == pred.backward_tiling and step.forward_tiling == pred.forward_tiling
    assert step.traffic == pred.exact == iosim.core.counts.combined(fwd.traffic, bwd.traffic)
    assert step.flops == pred.flops == fwd.flops + bwd.flops
    assert step.traffic.peak_sram == max(fwd.traffic.peak_sram, bwd.traffic.peak_sram)


@pytest.mark.parametrize("algorithm", BACKWARD_NAMES)
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (113, 239), (239, 113), (1, 1023)])
def test_awkward_shapes_causal(algorithm, n_q, n_k):
    rng = np.random.default_rng(n_q * 1000 + n_k)
    q, k, v = random_qkv(rng, 1, 2, n_q, n_k, 7)
    do = rng.standard_normal(q.shape)
    g = iosim.gradients(algorithm, q, k, v, do, M=3000, causal=True, dropout_p=0.1, seed=4)
    ref = iosim.attention_backward_ref(q, k, v, do, causal=True, dropout_p=0.1, seed=4)
    for name, x, r in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), ref):
        err = relative_error(x, r)
        assert err <= TOL, f"{algorithm} N_q={n_q} N_k={n_k}: {name} error {err:.3e}, blocks {g.backward_tiling}"


@pytest.mark.parametrize("algorithm", ["flash", "flash-swapped"])
def test_gradients_run_the_tiling_they_are_given_and_count_what_count_counts_at_it(algorithm):
    # gradients took no tiling=, so a backward tiling counted with count(pass_="bwd", tiling=...) could not be checked
    # numerically at the same tiles
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 2, 113, 70, 16)
    do = rng.standard_normal(q.shape)
    tiling = iosim.Tiling(16, 16)
    kw = dict(M="20k", causal=True)
    at = iosim.gradients(algorithm, q, k, v, do, tiling=tiling, **kw)
    chosen = iosim.gradients(algorithm, q, k, v, do, **kw)
    assert at.forward_tiling == at.backward_tiling == tiling != chosen.backward_tiling
    shape = dict(N=113, N_k=70, d=16, heads=2, tiling=tiling, **kw)
    assert at.forward_traffic == iosim.count(algorithm, pass_="fwd", **shape).traffic
    assert at.traffic == iosim.count(algorithm, pass_="bwd", **shape).traffic
    for got, want in ((at.dq, chosen.dq), (at.dk, chosen.dk), (at.dv, chosen.dv)):
        assert relative_error(got, want) < 1e-12
