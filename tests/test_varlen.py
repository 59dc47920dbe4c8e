"""Packed documents (varlen, issue 18 item 2): hand counts, closed forms, invariants, numerics, refusals.

Documents of lengths L_1 … L_b are packed end to end, Q, K, V of the same lengths, each
attending only to itself; one tiling serves them all, chosen for the longest, and each
document's blocks start at its first token. The traffic is Σ_b count(N=L_b) at that tiling.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from experiments import varlen
from iosim.api import count_problem, plan
from iosim.cli import build_parser, main, run
from iosim.core.counts import combined
from iosim.registry import ALGORITHMS

PACKING = [name for name, a in ALGORITHMS.items() if a.accepts("seqlens") and not a.accepts("block_mask")]
BACKWARD = [name for name in PACKING if ALGORITHMS[name].backward is not None]
AWKWARD = [1, 113, 239]
BIG_M = 10**6


def packed_inputs(seqlens, d=12, heads=2, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((1, heads, sum(seqlens), d)) for _ in range(4))
    return q, k, v, do


def spans(seqlens):
    starts = np.cumsum([0, *seqlens])
    return [slice(int(a), int(a) + L) for a, L in zip(starts, seqlens)]


def block_diagonal(seqlens, causal):
    """The packed problem's element mask: each document sees only itself (and, causal, only keys before it)."""
    n = sum(seqlens)
    keep = np.zeros((n, n), dtype=bool)
    for x in spans(seqlens):
        keep[x, x] = np.tril(np.ones((x.stop - x.start,) * 2, dtype=bool)) if causal else True
    return keep


def test_three_documents_by_hand():
    # flash (Alg. 1), no mask, d = 4, tiling B_r = 4, B_c = 3 given for the longest (10); documents 10, 5, 2.
    # Each document's tiling is capped to it: 10 and 5 keep 4 × 3, 2 takes 2 × 2.
    #   L = 10: key blocks 3, 3, 3, 1 (T_c = 4), every one meets every query: T_c·N = 40 query rows
    #   L = 5:  key blocks 3, 2 (T_c = 2): 2·5 = 10 query rows
    #   L = 2:  one key block of 2: 1·2 = 2 query rows
    # K, V read once (Σ L·d = 17·4); Q, O, ℓ, m re-read per query row met (52 rows: 52·d, 52);
    # O, ℓ, m written by line 3 (Σ L = 17 rows) and once per query row met (52).
    r = iosim.count("flash", seqlens=[10, 5, 2], d=4, M=BIG_M, tiling=iosim.Tiling(4, 3))
    t = r.traffic
    assert r.tiling == iosim.Tiling(4, 3)
    expected = {"Q": (52 * 4, 0), "K": (17 * 4, 0), "V": (17 * 4, 0), "O": (52 * 4, 17 * 4 + 52 * 4),
                "l": (52, 17 + 52), "m": (52, 17 + 52)}
    got = {x.name: (x.reads, x.writes) for x in t.tensors}
    assert got == expected, f"{got} != {expected}"
    assert t.peak_sram == iosim.count("flash", N=10, d=4, M=BIG_M, tiling=iosim.Tiling(4, 3)).traffic.peak_sram
    # padded: three documents of 10, each 40 query rows: Q 3·40·4 reads, K 3·10·4
    assert r.padded.tensor("Q").reads == 3 * 40 * 4 and r.padded.tensor("K").reads == 3 * 10 * 4
    assert r.packing_ratio == t.total / r.padded.total < 1


def test_two_causal_documents_by_hand():
    # flash, causal, d = 4, tiling 2 × 2; documents 4 and 2.
    #   L = 4: query blocks {0,1}, {2,3}, key blocks {0,1}, {2,3}; key block 1 is hidden from query block 0
    #          (rows 0, 1 see keys ≤ 1), so 3 tiles visited: 2 + 2 + 2 = 6 query rows met
    #   L = 2: one tile: 2 query rows
    # K, V: each key block visited once, Σ L·d = 6·4; Q, O re-read per query row met (8·4), ℓ, m (8);
    # writes: line 3 over Σ L = 6 rows, then once per query row met.
    t = iosim.count("flash", seqlens=[4, 2], d=4, M=BIG_M, causal=True, tiling=iosim.Tiling(2, 2)).traffic
    got = {x.name: (x.reads, x.writes) for x in t.tensors}
    assert got == {"Q": (32, 0), "K": (24, 0), "V": (24, 0), "O": (32, 24 + 32), "l": (8, 6 + 8),
                   "m": (8, 6 + 8)}, got


def test_cu_seqlens_are_the_same_documents():
    a = iosim.count("flash-swapped", seqlens=[3, 100, 7], d=16, M="20k", causal=True)
    b = iosim.count("flash-swapped", cu_seqlens=[0, 3, 103, 110], d=16, M="20k", causal=True)
    assert a.traffic == b.traffic and a.problem == b.problem


lengths = st.lists(st.integers(1, 300), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(seqlens=lengths, algo=st.sampled_from(PACKING), causal=st.booleans(), d=st.sampled_from([8, 24, 64]),
       pass_=st.sampled_from(["fwd", "bwd", "fwd+bwd"]), window=st.sampled_from([None, (5, 0), (17, 3)]))
def test_count_equals_predict_and_the_sum_of_plain_problems(seqlens, algo, causal, d, pass_, window):
    if pass_ != "fwd" and ALGORITHMS[algo].backward is None or window and not ALGORITHMS[algo].accepts("window"):
        return
    opts = dict(d=d, M="20k", causal=causal, pass_=pass_, window=window, heads=2)
    r = iosim.count(algo, seqlens=seqlens, **opts)
    p = iosim.predict(algo, seqlens=seqlens, **opts)
    assert r.traffic == p.exact, f"{seqlens}: {r.traffic.total} != {p.exact.total}"
    assert r.flops == p.flops
    tilings = dict(tiling=r.forward_tiling or r.backward_tiling) if pass_ != "fwd+bwd" else {}
    if tilings:  # one pass: Σ over documents of the plain count at the batch's tiling
        plain = combined(*(iosim.count(algo, N=L, **opts, **tilings).traffic for L in seqlens))
        assert r.traffic.total == plain.total and r.traffic.peak_sram == plain.peak_sram
    assert r.traffic.total <= r.padded.total == p.padded.total, f"{r.traffic.total} > {r.padded.total}"
    padded = iosim.count(algo, N=max(seqlens), batch=len(seqlens), **opts, **tilings).traffic
    assert not tilings or padded == r.padded


@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 5000), algo=st.sampled_from(PACKING), causal=st.booleans(), d=st.sampled_from([16, 64, 128]),
       pass_=st.sampled_from(["fwd", "fwd+bwd"]))
def test_one_document_is_the_plain_problem(L, algo, causal, d, pass_):
    if pass_ != "fwd" and ALGORITHMS[algo].backward is None:
        return
    opts = dict(d=d, M="100k", causal=causal, pass_=pass_, heads=3)
    one, plain = iosim.count(algo, seqlens=[L], **opts), iosim.count(algo, N=L, **opts)
    assert one.traffic == plain.traffic and one.flops == plain.flops and one.tiling == plain.tiling
    assert one.packing_ratio == 1


@settings(max_examples=30, deadline=None)
@given(seqlens=lengths, algo=st.sampled_from(PACKING), causal=st.booleans(), data=st.data())
def test_the_order_of_documents_changes_nothing(seqlens, algo, causal, data):
    order = data.draw(st.permutations(seqlens))
    a = iosim.count(algo, seqlens=seqlens, d=32, M="50k", causal=causal)
    b = iosim.count(algo, seqlens=order, d=32, M="50k", causal=causal)
    assert a.traffic == b.traffic and a.padded == b.padded


def test_a_count_costs_one_plain_count_per_distinct_length():
    seqlens = [100, 2000, 37] * 33_334  # 100,002 documents, 3 lengths
    pb = count_problem(None, 128, seqlens=seqlens, causal=True)
    assert len(plan("flash-swapped", pb, "192KiB").forward.parts()) == 3
    start = time.perf_counter()
    r = iosim.count("flash-swapped", seqlens=seqlens, d=128, M="192KiB", causal=True, pass_="fwd+bwd")
    p = iosim.predict("flash-swapped", seqlens=seqlens, d=128, M="192KiB", causal=True, pass_="fwd+bwd")
    elapsed = time.perf_counter() - start
    assert r.traffic == p.exact and r.padded.total > r.traffic.total
    assert elapsed < 2.0, f"count and predict of 100,002 documents took {elapsed:.2f} s"


@pytest.mark.parametrize("algo", PACKING)
@pytest.mark.parametrize("causal", [False, True])
def test_numerics_match_each_document_alone_and_the_block_diagonal_mask(algo, causal):
    seqlens = [113, 1, 239, 113]
    q, k, v, _ = packed_inputs(seqlens)
    r = iosim.simulate(algo, q, k, v, M="8k", causal=causal, seqlens=seqlens)
    assert r.out.shape == q.shape
    alone = max(float(np.abs(r.out[:, :, x] - iosim.attention_ref(q[:, :, x], k[:, :, x], v[:, :, x],
                                                                   causal=causal).out).max()) for x in spans(seqlens))
    whole = iosim.attention_ref(q, k, v, mask=block_diagonal(seqlens, causal))
    assert alone < 1e-12 and float(np.abs(r.out - whole.out).max()) < 1e-12, alone
    if r.l is not None:
        assert float(np.abs(r.lse - whole.lse).max()) < 1e-12
    assert r.traffic == iosim.count(algo, seqlens=seqlens, d=12, M="8k", causal=causal, heads=2).traffic


def test_numerics_with_a_window_and_grouped_heads():
    seqlens = [239, 1, 113]
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, sum(seqlens), 12))
    k, v = (rng.standard_normal((1, 2, sum(seqlens), 12)) for _ in range(2))
    r = iosim.simulate("flash", q, k, v, M="8k", window=(17, 0), seqlens=seqlens)
    for x in spans(seqlens):
        ref = iosim.attention_ref(q[:, :, x], k[:, :, x], v[:, :, x], window=(17, 0)).out
        assert float(np.abs(r.out[:, :, x] - ref).max()) < 1e-12
    assert r.traffic == iosim.count("flash", seqlens=seqlens, d=12, M="8k", window=(17, 0), heads=4,
                                    kv_heads=2).traffic


@pytest.mark.parametrize("algo", ["flash", "flash-swapped"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_each_document_alone_and_the_block_diagonal_mask(algo, causal):
    seqlens = AWKWARD
    q, k, v, do = packed_inputs(seqlens, seed=1)
    g = iosim.gradients(algo, q, k, v, do, M="8k", causal=causal, seqlens=seqlens)
    whole = iosim.attention_backward_ref(q, k, v, do, mask=block_diagonal(seqlens, causal))
    for got, ref in zip((g.dq, g.dk, g.dv), whole):
        assert float(np.abs(got - ref).max()) < 1e-12
    for x in spans(seqlens):
        alone = iosim.attention_backward_ref(q[:, :, x], k[:, :, x], v[:, :, x], do[:, :, x], causal=causal)
        assert max(float(np.abs(got[:, :, x] - ref).max()) for got, ref in zip((g.dq, g.dk, g.dv), alone)) < 1e-12
    c = iosim.count(algo, seqlens=seqlens, d=12, M="8k", causal=causal, heads=2, pass_="fwd+bwd")
    assert combined(g.forward_traffic, g.traffic) == c.traffic


def test_the_l2_model_leaves_packed_documents_alone():
    from iosim.gpu.dram import covered_dram
    from iosim.gpu.hardware import hardware

    hw = hardware("h100")
    r = iosim.count("flash-swapped", seqlens=[100, 2000], d=64, M="100k", gpu="h100")
    assert not hasattr(r, "dram")  # the DRAM level is an explicit call
    assert covered_dram(r.plans, hw, "flash-swapped") is None
    one = iosim.count("flash-swapped", N=2000, d=64, M="100k", gpu="h100")
    assert covered_dram(one.plans, hw, "flash-swapped") is not None


def test_document_lengths_are_spelled_as_counts_are():
    # N="1Ki" was taken while seqlens=["1Ki", 3] was refused
    want = iosim.count("flash", seqlens=[1024, 3, 7], d=64, M="100k").traffic.total
    assert iosim.count("flash", seqlens=["1Ki", "3", 7.0], d=64, M="100k").traffic.total == want
    assert iosim.count("flash", cu_seqlens=["0", "1Ki", 1027, 1034.0], d=64, M="100k").traffic.total == want


@pytest.mark.parametrize("kwargs, message", [
    (dict(seqlens=[3, 0]), r"seqlens\[1\]=0 must be a length >= 1"),
    (dict(seqlens=[]), r"seqlens=\[\] must hold at least one"),
    (dict(seqlens=[3, 2.5]), r"seqlens\[1\]=2.5 is not a whole number"),
    (dict(seqlens=[3, True]), r"seqlens\[1\]=True must be an integer"),
    (dict(seqlens=[3, "-3"]), r"seqlens\[1\]='-3' is outside the allowed range \[1, 2\*\*62\]"),
    (dict(seqlens=[3], cu_seqlens=[0, 3]), r"give one of them"),
    (dict(cu_seqlens=[1, 3]), r"cu_seqlens=\[1, 3\] must start at 0"),
    (dict(cu_seqlens=[0, 3, 3]), r"document 1 has length 0; allowed: lengths >= 1"),
    (dict(seqlens=[3], N=3), r"N=3, N_k=None with seqlens: the documents set the lengths"),
    (dict(seqlens=[3], batch=2), r"batch=2 with seqlens: .*allowed with seqlens: batch=1"),
    (dict(seqlens=[3], mask=True), r"mask=True with seqlens"),
    (dict(seqlens=[3], page_size=16, algo="flash-swapped"), r"page_size=16 with seqlens"),
    (dict(seqlens=[3], algo="split-kv"), r"seqlens for split-kv: it takes no packed documents .*\['standard', "),
    (dict(), r"N=None: give N"),
])
def test_bad_documents_are_refused_by_name(kwargs, message):
    kwargs = dict(kwargs)
    algo = kwargs.pop("algo", "flash")
    with pytest.raises(iosim.InputError, match=message):
        iosim.count(algo, d=8, M="20k", **kwargs)


def test_numeric_runs_refuse_mismatched_tokens():
    q, k, v, _ = packed_inputs([3, 4])
    with pytest.raises(iosim.InputError, match=r"q of 7 and k of 7 tokens with seqlens of 8"):
        iosim.simulate("flash", q, k, v, M="20k", seqlens=[4, 4])


def padded_batch(x, seqlens):
    """(1, heads, Σ L_b, cols) → (b, heads, max L_b, cols), document b at batch entry b, zeros after it."""
    out = np.zeros((len(seqlens), x.shape[1], max(seqlens), x.shape[3]))
    for b, span in enumerate(spans(seqlens)):
        out[b, :, :span.stop - span.start] = x[0, :, span]
    return out


@pytest.mark.parametrize("algo", BACKWARD)
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_is_that_of_each_document_at_its_place_in_the_padded_batch(algo, causal):
    # document b draws batch entry b's Philox streams at its own positions (flash-attn's varlen indexing), so the
    # packed run equals the reference on the documents padded to the longest, the padding's keys masked out;
    # documents 0 and 2 share a length and run as one part, which must not change their masks
    seqlens, p = [113, 1, 113, 239], 0.3
    q, k, v, do = packed_inputs(seqlens, seed=2)
    options = dict(causal=causal, dropout_p=p, seed=11)
    g = iosim.gradients(algo, q, k, v, do, M="8k", seqlens=seqlens, **options)
    out = iosim.simulate(algo, q, k, v, M="8k", seqlens=seqlens, **options).out
    real_keys = np.arange(max(seqlens))[None, :] < np.array(seqlens)[:, None]  # (b, max L): not padding
    mask = real_keys[:, None, None, :]
    pad = [padded_batch(x, seqlens) for x in (q, k, v, do)]
    ref_out = iosim.attention_ref(*pad[:3], mask=mask, **options).out
    ref_grads = iosim.attention_backward_ref(*pad, mask=mask, **options)
    for b, span in enumerate(spans(seqlens)):
        n = span.stop - span.start
        assert float(np.abs(out[0, :, span] - ref_out[b, :, :n]).max()) < 1e-12, b
        for name, got, ref in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), ref_grads):
            assert float(np.abs(got[0, :, span] - ref[b, :, :n]).max()) < 1e-12, (b, name)
    # the reference of each document alone, at its place among the documents, says the same
    for b, span in enumerate(spans(seqlens)):
        alone = iosim.attention_ref(q[:, :, span], k[:, :, span], v[:, :, span], first_batch=b, **options).out
        assert float(np.abs(out[:, :, span] - alone).max()) < 1e-12, b
    # and dropout did act: without it the output differs
    assert float(np.abs(out - iosim.simulate(algo, q, k, v, M="8k", seqlens=seqlens, causal=causal).out).max()) > 0.01


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--seqlens", "100", "0"], "argument --seqlens: 0 is outside the allowed range"),
    (["sweep", "--seqlens", "100", "30", "--N", "5"], "--N 5 with --seqlens: the documents set the lengths"),
    (["sweep", "--seqlens", "100", "30", "--algo", "split-kv"], "seqlens for split-kv: it takes no packed documents"),
    (["run", "--seqlens", "10", "20", "--batch", "2"], "batch=2 with seqlens"),
])
def test_cli_refuses_bad_documents_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_cli_shows_what_packing_saves(capsys):
    assert main(["sweep", "--seqlens", "100", "2000", "37", "--d", "64", "--algo", "flash", "--causal"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as the console wrapped it, unwrapped
    expected = iosim.count("flash", seqlens=[100, 2000, 37], d=64, M="100k", causal=True).packing_ratio
    assert "÷ padded" in out and f"{expected:.3f}" in out and "3 documents packed end to end" in out
    assert main(["run", "--seqlens", "1", "113", "239", "--d", "16", "--M", "8k", "--causal", "--pass",
                 "fwd+bwd"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "every document padded to" in out and "3 packed documents of 353 tokens" in out


def test_the_experiment_splits_its_tokens_exactly():
    lengths = varlen.lengths
    assert lengths(0.0) == [2048] * 16
    for sigma in (0.5, 2.0, 4.6):
        split = lengths(sigma)
        assert sum(split) == 32768 and min(split) >= 1 and split == sorted(split), split


@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
def test_cli_run_checks_packed_dropout_against_each_document_at_its_place(pass_):
    args = build_parser().parse_args(["run", "--seqlens", "10", "23", "10", "--dropout", "0.2", "--d", "16", "--M",
                                      "8k", "--causal", "--pass", pass_])
    outcome = run(args)
    assert outcome.max_abs_error < 1e-12, outcome.max_abs_error
