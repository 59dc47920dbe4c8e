"""A paged KV cache (page_size=, --page-size): K and V read by rows through a block table, counted exactly."""

import json

import numpy as np
import pytest
from helpers import relative_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim.api import count_problem
from iosim.cli import build_parser, main, run
from iosim.core.tiling import Tiling
from iosim.reports.optimize import optimize

PAGED = [name for name, a in iosim.ALGORITHMS.items() if a.accepts("page_size")]
UNPAGED = [name for name in iosim.ALGORITHMS if name not in PAGED]
TOL = 1e-12


def test_the_algorithms_that_read_pages_are_the_decode_path():
    assert PAGED == ["flash-swapped", "split-kv"]


@pytest.mark.parametrize("Bc, entries", [(32, 7), (8, 13), (100, 7)])
def test_block_table_reads_by_hand(Bc, entries):
    # N_k = 100 keys in pages of 16: 7 pages, the last holding 4 keys. One query block reads, per K/V block, the
    # entries of the pages it spans: B_c = 32 (2 pages a block): 2 + 2 + 2 + 1 (the 4-key block) = 7; B_c = 8 (a
    # half page): 13 blocks of one entry each; B_c = 100 = N_k: one block over all 7 pages.
    for algorithm in PAGED:
        r = iosim.count(algorithm, N=1, N_k=100, d=8, M="20k", page_size=16, tiling=iosim.Tiling(1, Bc), splits=1)
        t = r.traffic
        assert t.tensor("block_table").reads == entries and t.tensor("block_table").itemsize == 4, algorithm
        assert t.tensor("K").reads == t.tensor("V").reads == 100 * 8  # by rows: the last page's 4 keys only


@pytest.mark.parametrize("algorithm", PAGED)
def test_predict_reads_every_page_of_a_ragged_last_block_longer_than_a_page(algorithm):
    # Kills the mutant of the closed form's page count, iosim.variants.paging.entries = max(1, b_j // page_size) (the
    # floor, not the ceiling, of a block longer than a page), which otherwise only a chance Hypothesis draw kills:
    # N_k = 100 keys in pages of 16, K/V blocks of B_c = 64: a block of 64 keys (pages 0-3: 4 entries), then the
    # ragged last block of 36 keys, longer than a page and not a multiple of one (keys 64-99 lie in pages 4, 5 and 6:
    # ⌈36/16⌉ = 3 entries, where the floor gives 2). One query block: 4 + 3 = 7 entries, counted and predicted.
    opts = dict(N=1, N_k=100, d=64, M="20k", page_size=16, tiling=iosim.Tiling(1, 64), splits=1)
    counted, predicted = iosim.count(algorithm, **opts), iosim.predict(algorithm, **opts)
    table = counted.traffic.tensor("block_table")
    assert table.reads == 7, table
    assert predicted.exact == counted.traffic, (predicted.exact.tensor("block_table"), table)


@st.composite
def decodes(draw):
    kv_heads, group = draw(st.integers(1, 2)), draw(st.sampled_from([1, 4]))
    d = draw(st.sampled_from([1, 5, 16]))
    return dict(batch=draw(st.integers(1, 2)), heads=kv_heads * group, kv_heads=kv_heads,
                N=draw(st.sampled_from([1, 2, 4, 17])), N_k=draw(st.sampled_from([1, 63, 239, 1023])), d=d,
                M=draw(st.integers(40 * d + 300, 6000)), causal=draw(st.booleans()),
                page_size=draw(st.sampled_from([1, 3, 16, 100, 256])), seed=draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("algorithm", PAGED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=decodes())
def test_paged_numeric_count_and_closed_form_agree_and_numerics_do_not_change(algorithm, c):
    rng = np.random.default_rng(c["seed"])
    q = rng.standard_normal((c["batch"], c["heads"], c["N"], c["d"]))
    k, v = (rng.standard_normal((c["batch"], c["kv_heads"], c["N_k"], c["d"])) for _ in range(2))
    r = iosim.simulate(algorithm, q, k, v, M=c["M"], causal=c["causal"], page_size=c["page_size"])
    ref = iosim.attention_ref(q, k, v, causal=c["causal"])
    assert relative_error(r.out, ref.out) <= TOL, c
    shape = {key: c[key] for key in ("batch", "heads", "kv_heads", "N", "N_k", "d", "M", "causal", "page_size")}
    counted = iosim.count(algorithm, **shape)
    assert counted.traffic == r.traffic == iosim.predict(algorithm, **shape).exact, c
    # by rows: K and V are what the same tiling reads unpaged, whatever the page size
    unpaged = iosim.count(algorithm, **{**shape, "page_size": None}, tiling=r.tiling, splits=r.tiling.splits)
    for name in ("K", "V"):
        assert counted.traffic.tensor(name) == unpaged.traffic.tensor(name), (name, c)


@pytest.mark.parametrize("algorithm", PAGED)
@pytest.mark.parametrize("N, N_k", [(1, 1), (1, 113), (4, 1023), (239, 239)])
def test_a_page_of_one_token_reads_exactly_the_rows_and_one_entry_a_row(algorithm, N, N_k):
    opts = dict(N=N, N_k=N_k, d=24, M="30k", heads=4, kv_heads=2, causal=True)
    paged = iosim.count(algorithm, page_size=1, **opts).traffic
    plain = iosim.count(algorithm, **opts).traffic
    assert paged.tensors == plain.tensors[:3] + (paged.tensor("block_table"),) + plain.tensors[3:]
    # every key row loaded reads its own page's entry: the K rows read, over d
    assert paged.tensor("block_table").reads * 24 == plain.tensor("K").reads
    assert paged.peak_sram == plain.peak_sram


@pytest.mark.parametrize("algorithm", UNPAGED)
def test_an_algorithm_without_pages_refuses_them_by_name(algorithm):
    with pytest.raises(iosim.InputError, match=rf"page_size=16 for {algorithm}, pass 'fwd': it reads no paged K/V "
                                               rf"cache; allowed: page_size=None, or the forward pass of one that "
                                               rf"does: \['flash-swapped', 'split-kv'\]"):
        iosim.count(algorithm, N=1, N_k=64, d=8, M="20k", page_size=16)


def test_backward_passes_and_misaligned_tilings_are_refused():
    with pytest.raises(iosim.InputError, match="pass 'bwd'"):
        iosim.count("flash-swapped", N=4, N_k=64, d=8, M="20k", page_size=16, pass_="bwd")
    with pytest.raises(iosim.InputError, match="tiling B_c=24 with page_size=16: .* a multiple or a divisor of 16"):
        iosim.count("split-kv", N=1, N_k=64, d=8, M="20k", page_size=16, tiling=iosim.Tiling(1, 24))
    with pytest.raises(iosim.InputError, match="page_size=0"):
        iosim.count("split-kv", N=1, N_k=64, d=8, M="20k", page_size=0)


@settings(max_examples=40, deadline=None)
@given(N_k=st.integers(1, 5000), page=st.integers(1, 600))
def test_a_policy_tiling_holds_whole_pages_or_lies_in_one(N_k, page):
    r = iosim.count("split-kv", N=1, N_k=N_k, d=64, M="100k", heads=8, kv_heads=2, page_size=page)
    Bc = r.tiling.Bc
    assert Bc % page == 0 or page % Bc == 0 or Bc == N_k, (Bc, page)


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_sweep_passes_page_size_to_the_paged_algorithms_and_keys_records_by_it(tmp_path):
    js = tmp_path / "s.json"
    out = run(parse("sweep", "--N", "1", "--N-k", "4Ki", "--d", "128", "--algo", "flash", "split-kv",
                    "--page-size", "16", "--json", str(js)))
    assert out.notes == ("--page-size 16 applies to flash-swapped, split-kv only; ignored by flash",)
    flash, split = out.rows
    assert flash.counts.tensors[3].name == "O" and split.counts.tensor("block_table").reads > 0
    assert [r["page_size"] for r in json.loads(js.read_text())] == [None, 16]


def test_run_reads_pages_and_refuses_them_one_line(capsys):
    out = run(parse("run", "--algo", "split-kv", "--N", "2", "--N-k", "300", "--d", "16", "--page-size", "32"))
    assert out.max_rel_error < TOL and out.result.traffic.tensor("block_table").reads > 0
    assert main(["run", "--algo", "flash", "--N", "2", "--N-k", "300", "--d", "16", "--page-size", "32"]) == 2
    assert main(["run", "--algo", "flash-swapped", "--N", "8", "--d", "16", "--page-size", "4", "--pass", "bwd"]) == 2
    assert [line.startswith("iosim: error:") for line in capsys.readouterr().err.splitlines()] == [True, True]


def test_the_l2_model_leaves_a_paged_run_alone():
    # the kernels' grids read no block table: a paged run has no DRAM bytes rather than ones that miss the table
    from iosim.gpu.dram import covered_dram
    from iosim.gpu.hardware import hardware

    hw = hardware("h100")
    opts = dict(N=1, N_k=4096, d=128, M="228KiB", heads=8, kv_heads=2, gpu="h100")
    plain, paged = iosim.count("split-kv", **opts), iosim.count("split-kv", page_size=16, **opts)
    assert not hasattr(plain, "dram") and not hasattr(paged, "dram")  # the DRAM level is an explicit call
    assert covered_dram(plain.plans, hw, "split-kv") is not None
    assert covered_dram(paged.plans, hw, "split-kv") is None


@pytest.mark.parametrize("algorithm", PAGED)
@pytest.mark.parametrize("n_k, page", [(100, 16), (113, 32), (239, 32), (64, 4), (100, 1)])
def test_the_optimal_policy_searches_the_tilings_a_paged_cache_takes(algorithm, n_k, page):
    # brute force: every tiling whose K/V block holds whole pages or lies in one and fits M, by exact closed form.
    # (Searching every tiling and then rounding the winner's B_c to the pages missed the best at N_k = 100, 113
    # and 239 with pages of 16 and 32: 3,893 elements against 3,887 at N_k = 100, page 16.)
    algo, M, n_q = iosim.ALGORITHMS[algorithm], 3000, 20
    pb = count_problem(n_q, 16, n_k, page_size=page)
    run_pb = algo.run_problem(pb)
    best = min(algo.traffic(run_pb, Tiling(Br, Bc), M).total
               for Br in range(1, run_pb.shape.n_q + 1) for Bc in range(1, n_k + 1)
               if (Bc % page == 0 or page % Bc == 0 or Bc == n_k) and algo.working_set(run_pb, Tiling(Br, Bc), M) <= M)
    r = iosim.count(algorithm, N=n_q, N_k=n_k, d=16, M=M, page_size=page, block_policy="optimal")
    assert r.traffic.total == best and (r.tiling.Bc % page == 0 or page % r.tiling.Bc == 0 or r.tiling.Bc == n_k)


def test_optimize_takes_a_page_size(tmp_path):
    path = tmp_path / "o.json"
    outcome = run(build_parser().parse_args(["optimize", "--N", "20", "--N-k", "100", "--d", "16", "--M", "3000",
                                             "--page-size", "16", "--json", str(path)]))
    # by default the algorithms that read a paged cache, each at the best tiling of whole pages or within one
    assert [r.algorithm for r in outcome.results] == PAGED
    for r in outcome.results:
        want = iosim.count(r.algorithm, N=20, N_k=100, d=16, M=3000, page_size=16, block_policy="optimal")
        assert r.measured == want.traffic and all(16 % x.tiling.Bc == 0 or x.tiling.Bc % 16 == 0 for x in r.best)
    assert len(json.loads(path.read_text())) >= len(PAGED)
    results = optimize(["flash", "split-kv"], N=20, N_k=100, d=16, M=3000, page_size=16)
    # the seam's one refusal (Algorithm.refuse_options), as plan words it
    assert str(results[0]).startswith("page_size=16 for flash, pass 'fwd': it reads no paged K/V cache; allowed: "
                                      "page_size=None, or the forward pass of one that does: [")
    assert results[1].algorithm == "split-kv"
