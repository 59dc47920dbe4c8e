"""Chunked prefill and prefix caching (iosim.chunked_prefill, iosim prefill): exact sums of per-chunk counts."""

import csv
import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import build_parser, main, run
from iosim.core.counts import combined
from iosim.plans import Plan

DENSE = [name for name, a in iosim.ALGORITHMS.items() if a.listed_by_default(())]  # no block mask to use


def chunk_by_chunk(algorithm, N, C, d, M, prefix=0, **options):
    """Σ_k count(N=C_k, N_k=P + k·C + C_k, causal=True): the definition, one count per chunk."""
    chunks = [(k * C, min(C, N - k * C)) for k in range(-(-N // C))]
    return combined(*(iosim.count(algorithm, N=c, N_k=prefix + start + c, d=d, M=M, causal=True, **options).traffic
                      for start, c in chunks))


def without_peak(counts):
    return {t.name: (t.reads, t.writes) for t in counts.tensors}


def test_by_hand_six_tokens_in_chunks_of_four():
    # N = 6, C = 4: chunk 0 is rows 0-3 against keys 0-3, chunk 1 rows 4-5 against keys 0-5. Blocks of 2 × 2, d = 3.
    # flash-swapped: chunk 0's query blocks see 1 and 2 key blocks, chunk 1's one block 3: (1 + 2 + 3)·2 = 12 key
    # rows, K and V 12·3 = 36 each; Q read and O written once (6·3 = 18), ℓ and m written once (6).
    tiling = iosim.Tiling(2, 2)
    r = iosim.chunked_prefill("flash-swapped", N=6, C=4, d=3, M=1000, tiling=tiling)
    assert without_peak(r.traffic) == {"Q": (18, 0), "K": (36, 0), "V": (36, 0), "O": (0, 18), "l": (0, 6),
                                       "m": (0, 6)}
    assert [(g.length, g.chunks) for g in r.groups] == [(4, 1), (2, 1)] and r.chunks == 2
    # flash (K/V outer): each chunk loads every key block of its prefix once: 4 + 6 = 10 key rows, 30 each of K and V.
    # Visited tiles, 3 per chunk of 2 query rows each: 12 query rows met, so Q, O read 12·3 = 36, ℓ, m 12; O written
    # 36 + the zeros of line 3 (18), ℓ and m 12 + 6.
    r = iosim.chunked_prefill("flash", N=6, C=4, d=3, M=1000, tiling=tiling)
    assert without_peak(r.traffic) == {"Q": (36, 0), "K": (30, 0), "V": (30, 0), "O": (36, 54), "l": (12, 18),
                                       "m": (12, 18)}
    # unchunked, flash loads the 6 keys once (18 each of K and V), and meets the same 6 tiles
    assert without_peak(r.unchunked) == {**without_peak(r.traffic), "K": (18, 0), "V": (18, 0)}


@st.composite
def prompts(draw):
    d = draw(st.sampled_from([1, 5, 16, 24]))
    N = draw(st.sampled_from([1, 7, 113, 239, 1023]))
    C = draw(st.integers(max(1, N // 40), N + 5))
    tiling = draw(st.none() | st.tuples(st.integers(1, 40), st.integers(1, 40)).map(lambda t: iosim.Tiling(*t)))
    kv_heads, group = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3]))
    return dict(N=N, C=C, d=d, M=draw(st.integers(60 * d + 200, 6000)), prefix=draw(st.sampled_from([0, 1, 37, 300])),
                tiling=tiling, batch=draw(st.integers(1, 2)), heads=kv_heads * group, kv_heads=kv_heads)


@pytest.mark.parametrize("algorithm", DENSE)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=prompts())
def test_equals_the_sum_of_one_count_per_chunk(algorithm, c):
    options = dict(tiling=c["tiling"], batch=c["batch"], heads=c["heads"], kv_heads=c["kv_heads"])
    try:
        r = iosim.chunked_prefill(algorithm, N=c["N"], C=c["C"], d=c["d"], M=c["M"], prefix=c["prefix"], **options)
    except iosim.BlockSizeError:  # an explicit tiling that does not fit M
        return
    assert r.traffic == chunk_by_chunk(algorithm, c["N"], min(c["C"], c["N"]), c["d"], c["M"], c["prefix"],
                                       **options), c
    whole = iosim.count(algorithm, N=c["N"], N_k=c["prefix"] + c["N"], d=c["d"], M=c["M"], causal=True, **options)
    assert r.unchunked == whole.traffic


@pytest.mark.parametrize("algorithm", DENSE)
@pytest.mark.parametrize("N", [1, 113, 1023])
def test_one_chunk_is_the_plain_causal_prefill(algorithm, N):
    plain = iosim.count(algorithm, N=N, d=24, M="20k", causal=True, heads=2)
    for C in (N, N + 1, 10**6):
        r = iosim.chunked_prefill(algorithm, N=N, C=C, d=24, M="20k", heads=2)
        assert r.traffic == plain.traffic == r.unchunked and r.ratio == 1.0 and r.chunks == 1, (C, r.groups)


@st.composite
def aligned(draw):
    """Chunks whose length is a whole number of query blocks, and a first chunk no shorter than a key block."""
    Br, Bc = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    C = Br * draw(st.integers(1, 6))
    prefix = draw(st.sampled_from([0, 5, 64]))
    N = draw(st.integers(1, 700))
    return dict(N=N, C=C, prefix=prefix, tiling=iosim.Tiling(Br, min(Bc, prefix + min(C, N))),
                d=draw(st.sampled_from([3, 16])), heads=draw(st.integers(1, 3)))


@settings(max_examples=60, deadline=None)
@given(c=aligned())
def test_chunks_of_whole_query_blocks_cost_flash_swapped_nothing_and_flash_the_prefix(c):
    # With one tiling and B_r | C the chunks' query blocks are the unchunked run's, each seeing the same key blocks
    # (causal, bottom-right: query t sees keys <= P + t in both). flash-swapped reads Q once, writes O, l, m once, and
    # reads K, V per query block up to the end of its last visible key block, which a chunk ends at its own last
    # key (a ragged block) where the unchunked run reads it whole: K and V no more than unchunked, the same when
    # B_c divides C and P (every chunk ends on a key block's end).
    opts = dict(N=c["N"], C=c["C"], d=c["d"], M=10**6, prefix=c["prefix"], tiling=c["tiling"], heads=c["heads"])
    swapped = iosim.chunked_prefill("flash-swapped", **opts)
    chunked, whole = without_peak(swapped.traffic), without_peak(swapped.unchunked)
    assert {t: chunked[t] for t in "QOlm"} == {t: whole[t] for t in "QOlm"}, c
    assert chunked["K"] == chunked["V"] and chunked["K"][0] <= whole["K"][0], c
    Bc = c["tiling"].Bc
    if c["C"] % Bc == 0 and c["prefix"] % Bc == 0:
        assert chunked == whole, c
    # flash loads every key block of a chunk's prefix once per chunk: K and V read Σ_k N_k keys instead of P + N,
    # that is d·Σ_{k<K−1} (P + (k+1)·C) more each; its visited tiles, and so Q, O, l, m, are the unchunked run's.
    flash = iosim.chunked_prefill("flash", **opts)
    K = -(-c["N"] // c["C"])
    extra = c["heads"] * c["d"] * sum(c["prefix"] + (k + 1) * c["C"] for k in range(K - 1))
    expected = without_peak(flash.unchunked)
    expected.update(K=(expected["K"][0] + extra, 0), V=(expected["V"][0] + extra, 0))
    assert without_peak(flash.traffic) == expected, c


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 2000), C=st.integers(1, 2000), prefix=st.sampled_from([0, 9, 500]))
def test_standard_materializes_only_each_chunks_scores(N, C, prefix):
    # standard writes S (and P) of C_k × N_k per chunk: Σ_k C_k·(P + k·C + C_k) ≤ N·(P + N), the unchunked N_q × N_k.
    r = iosim.chunked_prefill("standard", N=N, C=C, d=16, M="20k", prefix=prefix)
    C = min(C, N)
    area = sum(min(C, N - s) * (prefix + min(N, s + C)) for s in range(0, N, C))
    assert r.traffic.tensor("S").writes == area <= N * (prefix + N) == r.unchunked.tensor("S").writes


def test_a_million_tokens_cost_a_few_closed_forms(monkeypatch):
    calls = []
    exact = Plan.exact
    monkeypatch.setattr(Plan, "exact", lambda self: calls.append(self) or exact(self))
    r = iosim.chunked_prefill("flash-swapped", N=10**6, C=512, d=128, M="192KiB", heads=32, kv_heads=8)
    # 1954 chunks: 1953 of 512 and one of 64, in a handful of tilings and residue classes
    assert r.chunks == 1954 and [(g.length, g.chunks) for g in r.groups] == [(512, 1953), (64, 1)]
    assert len(calls) <= 20, [p.tiling for p in calls]


@pytest.mark.parametrize("N, C", [(10**12, 512), (2**20, 1)])
def test_the_tilings_chosen_grow_with_the_log_of_the_chunks(monkeypatch, N, C):
    from iosim.serving import chunked

    chosen = []
    plan = chunked.plan
    monkeypatch.setattr(chunked, "plan", lambda *a, **k: chosen.append(a[1].shape.n_k) or plan(*a, **k))
    r = iosim.chunked_prefill("flash-swapped", N=N, C=C, d=128, M="192KiB")
    # a bisection for where the tilings settle (N_k past the key block), each chunk before it, and three chunks of
    # each of the B_c / gcd(C, B_c) residue classes after it: O(log n + B_c), however many chunks
    Bc = iosim.count("flash-swapped", N=C, N_k=N, d=128, M="192KiB", causal=True).tiling.Bc
    assert r.chunks == -(-N // C) and len(chosen) <= 64 + Bc // C + 3 * Bc // math.gcd(C, Bc), (len(chosen), Bc)
    K = r.traffic.tensor("K").reads  # every chunk reads its keys at least once: Σ_k (k + 1)·C ≥ N²/(2C) elements
    assert K >= N * (N + C) // (2 * C) * 128 // C * C


def test_the_optimal_policy_refuses_more_chunks_than_it_can_search():
    with pytest.raises(iosim.InputError, match="block_policy='optimal' searches each chunk's tiling"):
        iosim.chunked_prefill("flash-swapped", N=10**6, C=16, d=64, M="100k", block_policy="optimal")


@pytest.mark.parametrize("bad, message", [
    (dict(C=0), "C=0"), (dict(prefix=-1), "prefix=-1 is outside the allowed range [0, 2**62]"),
    (dict(prefix=True), "prefix=True"), (dict(N=0), "N=0"),
    (dict(prefix=2**70), "prefix=1180591620717411303424 is outside the allowed range [0, 2**62]"),
    (dict(prefix=2**62), "prefix=4,611,686,018,427,387,904 with N=100: their keys, 4,611,686,018,427,388,004, pass "
                         "the allowed 2**62"),  # where the problem would have named only N_k
])
def test_bad_input_is_refused_by_name(bad, message):
    with pytest.raises(iosim.InputError, match=re.escape(message)):
        iosim.chunked_prefill("flash", **{**dict(N=100, C=10, d=16, M="20k"), **bad})


def test_the_prefix_takes_units_as_the_cli_does():
    a = iosim.chunked_prefill("flash", N=100, C=10, d=16, M="20k", prefix="1Ki")
    b = iosim.chunked_prefill("flash", N=100, C=10, d=16, M="20k", prefix=1024)
    assert a.prefix == 1024 and a.traffic == b.traffic


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_cli_sweeps_chunk_sizes_and_saves_one_record_each(tmp_path):
    js, cs = tmp_path / "p.json", tmp_path / "p.csv"
    out = run(parse("prefill", "--N", "4Ki", "--chunk", "256", "1000", "4Ki", "--d", "64", "--M", "100k",
                    "--prefix", "1Ki", "--heads", "4", "--kv-heads", "2", "--json", str(js), "--csv", str(cs)))
    assert [(r.algorithm, r.C) for r in out.results] == [(a, C) for a in ("flash", "flash-swapped")
                                                         for C in (256, 1000, 4096)]
    api = iosim.chunked_prefill("flash", N=4096, C=1000, d=64, M="100k", prefix=1024, heads=4, kv_heads=2)
    assert out.results[1].traffic == api.traffic
    records = json.loads(js.read_text())
    assert [r["chunks"] for r in records[:3]] == [16, 5, 1] and records[1]["last_chunk"] == 96
    assert records[2]["ratio"] == 1.0 and records[1]["total"] == api.traffic.total
    assert {(r["gpu"], r["block_policy"]) for r in records} == {(None, "fit")}  # what else sets the counts
    with cs.open() as f:
        assert [int(r["total"]) for r in csv.DictReader(f)] == [r["total"] for r in records]


def test_cli_prints_the_table(capsys):
    assert main(["prefill", "--N", "32Ki", "--chunk", "512", "32Ki", "--d", "128", "--gpu", "h100"]) == 0
    text = capsys.readouterr().out
    assert "flash-swapped" in text and "÷ C = N" in text


@pytest.mark.parametrize("argv", [["--chunk", "0"], ["--chunk", "64", "--prefix", "-1"], ["--chunk", "1q"]])
def test_cli_bad_input_is_one_line_and_status_2(capsys, argv):
    assert main(["prefill", "--N", "1Ki", "--d", "64", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iosim: error:") and err.count("\n") == 1


def test_an_fp8_prefill_leaves_out_the_default_algorithm_without_an_fp8_path_and_says_so(capsys):
    out = run(parse("prefill", "--N", "1Ki", "--chunk", "256", "--d", "64", "--dtype", "float8_e4m3"))
    assert [r.algorithm for r in out.results] == ["flash-swapped"]
    assert out.notes == ("--dtype float8_e4m3 leaves out flash: no FP8 path",)
    assert out.results[0].traffic == iosim.chunked_prefill("flash-swapped", N=1024, C=256, d=64, M="100k",
                                                           dtype="float8_e4m3").traffic
    assert main(["prefill", "--N", "1Ki", "--chunk", "256", "--d", "64", "--dtype", "float8_e4m3"]) == 0
    assert "leaves out flash: no FP8 path" in capsys.readouterr().out
    assert main(["prefill", "--N", "1Ki", "--chunk", "256", "--d", "64", "--dtype", "float8_e4m3",
                 "--algo", "flash"]) == 2  # named, it is refused by name
    assert "has no FP8 path" in capsys.readouterr().err
