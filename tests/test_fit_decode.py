"""The fit policy gives a decoding problem the tiling a decode kernel uses: one query block, long K/V blocks."""

import pytest

import iosim
from iosim.api import count_problem
from iosim.core.tiling import Tiling
from iosim.registry import ALGORITHMS, get_algorithm

QUERY_OUTER = [n for n, a in ALGORITHMS.items() if a.outer == "Br" and a.listed_by_default(())]


@pytest.mark.parametrize("name", QUERY_OUTER)
@pytest.mark.parametrize("n_q, n_k, d, M", [(1, 4096, 128, 100_000), (4, 4096, 128, 100_000),
                                            (16, 239, 64, 20_000), (1, 113, 64, 1_000_000)])
def test_decoding_gets_one_query_block_and_the_longest_kv_block_that_fits(name, n_q, n_k, d, M):
    algo = get_algorithm(name)
    pb = count_problem(n_q, d, n_k)
    problem = dict(N=n_q, N_k=n_k, d=d, M=M, splits=1 if algo.accepts("splits") else None)  # one split: see below
    t = iosim.count(name, **problem).tiling
    assert t.Br == n_q and t.Bc > n_q
    assert t.Bc == n_k or algo.working_set(pb, Tiling(n_q, t.Bc + 1), M) > M
    assert iosim.count(name, **problem).traffic == iosim.predict(name, **problem).exact


@pytest.mark.parametrize("n_q, n_k, heads, kv_heads", [(1, 4096, 32, 8), (1, 239, 1, 1), (4, 32_768, 8, 1),
                                                       (1, 100, 1, 1), (1, 4096, 256, 256), (256, 256, 1, 1)])
def test_split_kv_fills_the_sms_with_splits_of_whole_blocks(n_q, n_k, heads, kv_heads):
    shape = dict(N=n_q, N_k=n_k, d=128, M=100_000, heads=heads, kv_heads=kv_heads)
    one = iosim.count("split-kv", splits=1, **shape).tiling
    t = iosim.count("split-kv", **shape).tiling
    wanted = -(-132 // (kv_heads * -(-n_q * heads // kv_heads // t.Br)))  # an H100's SMs over the work units
    assert t.splits == max(1, min(-(-n_k // min(one.Bc, 128)), wanted))  # no split shorter than min(B_c, d) keys
    assert t.Br == one.Br and t.Bc == min(one.Bc, n_k // t.splits) and -(-n_k // t.Bc) >= t.splits
    assert iosim.count("split-kv", **shape).traffic == iosim.predict("split-kv", **shape).exact


@pytest.mark.parametrize("name", QUERY_OUTER)
def test_prefill_keeps_the_papers_shape(name):
    t = iosim.count(name, N=4096, d=64, M=100_000).tiling
    assert min(t.Br, t.Bc) == 64
