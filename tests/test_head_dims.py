"""Q/K and V head sizes apart (d, d_v), as MLA's heads have them: what the API, the CLI and the refusals do with them.

The algorithms themselves are held on d_v ≠ d where every algorithm is: float64 exactness (test_exactness,
test_backward), counts equal to closed forms (test_traffic, test_backward, test_flops), whose strategies draw d_v
apart from d half the time. Here: hand-derived counts that tell d from d_v, the command line, and everything that
takes one head size refusing two by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import random_qkv, relative_error

import iosim
from iosim.cli import main as cli_main
from iosim.core.errors import InputError
from iosim.reports.optimize import optimize


def test_flash_counts_by_hand_tell_d_from_d_v():
    # N = 239, d = 16, d_v = 8, blocks B_r = 16, B_c = 50: T_c = ⌈239/50⌉ = 5. K is read once (N·d), V once (N·d_v);
    # Q (N·d), O (N·d_v), ℓ and m are read once per key block; O (N·d_v), ℓ, m written once per key block and once
    # more by line 3. Kills a mutant that sizes V or O by d, or Q or K by d_v.
    N, d, d_v = 239, 16, 8
    M = (50 + 16) * (d + d_v) + 16 * 50 + 6 * 16  # the working set of B_r = 16, B_c = 50
    r = iosim.count("flash", N=N, d=d, d_v=d_v, M=M)
    assert r.tiling == iosim.Tiling(16, 50)
    t = {x.name: x for x in r.traffic.tensors}
    assert (t["Q"].reads, t["K"].reads, t["V"].reads) == (5 * N * d, N * d, N * d_v)
    assert (t["O"].reads, t["O"].writes, t["l"].writes) == (5 * N * d_v, 6 * N * d_v, 6 * N)
    assert r.traffic.peak_sram == M
    # the arithmetic: QKᵀ of d and PV of d_v over the whole N × N scores
    assert r.flops.matmul == 2 * N * N * (d + d_v)


def test_split_kv_decode_with_mla_head_sizes_reads_each_once():
    # one decoding query per head, 16 heads on one shared K/V head, d = 576 (K), d_v = 512 (V): split-kv packs the
    # 16 heads into one query block, so K (N_k·576) and V (N_k·512) are read once each, Q once per split
    n_k, S = 4096, 4
    r = iosim.count("split-kv", N=1, N_k=n_k, d=576, d_v=512, heads=16, kv_heads=1, M="228KiB", splits=S)
    t = {x.name: x for x in r.traffic.tensors}
    assert (t["K"].reads, t["V"].reads) == (n_k * 576, n_k * 512)
    assert t["Q"].reads == S * 16 * 576 and t["O"].writes == 16 * 512
    assert t["O_split"].writes == t["O_split"].reads == S * 16 * 512
    assert r.traffic == iosim.predict("split-kv", N=1, N_k=n_k, d=576, d_v=512, heads=16, kv_heads=1, M="228KiB",
                                      splits=S).exact


def test_d_v_equal_to_d_is_the_one_head_size_problem():
    one = iosim.count("flash-swapped", N=300, d=24, M=5000, causal=True, pass_="fwd+bwd")
    two = iosim.count("flash-swapped", N=300, d=24, d_v=24, M=5000, causal=True, pass_="fwd+bwd")
    assert one.traffic == two.traffic and one.flops == two.flops and one.problem == two.problem


def test_run_and_sweep_take_d_v(tmp_path, capsys):
    path = tmp_path / "run.json"
    assert cli_main(["run", "--algo", "flash", "--N", "113", "--N-k", "239", "--d", "5", "--d-v", "9", "--M", "2000",
              "--causal", "--pass", "fwd+bwd", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    record = record[0] if isinstance(record, list) else record
    assert (record["d"], record["d_v"]) == (5, 9)
    assert record["max_rel_error"] < 1e-12
    sweep = tmp_path / "sweep.json"
    args = ["sweep", "--N", "1024", "--d", "192", "--algo", "flash", "standard", "--json", str(sweep)]
    assert cli_main([*args, "--d-v", "128"]) == 0
    rows = json.loads(sweep.read_text())
    assert [(r["d"], r["d_v"]) for r in rows] == [(192, 128)] * 2
    assert "192/128" in capsys.readouterr().out
    # a resumed sweep tells d_v apart: the rows of d_v = d are new
    assert cli_main([*args, "--resume"]) == 0
    rows = json.loads(sweep.read_text())
    assert sorted(str(r["d_v"]) for r in rows) == ["128", "128", "None", "None"]


def test_bad_d_v_is_refused_by_name(capsys):
    with pytest.raises(InputError, match="d_v"):
        iosim.count("flash", N=64, d=16, d_v=0, M=10_000)
    assert cli_main(["sweep", "--N", "64", "--d", "16", "--d-v", "-3"]) == 2
    assert "argument --d-v" in capsys.readouterr().err
    assert cli_main(["optimize", "--N", "64", "--d", "16", "--d-v", "4", "--objective", "dram", "--gpu", "h100",
                     "--algo", "flash"]) == 2
    assert "d_v=4 beside d=16" in capsys.readouterr().err


def test_what_takes_one_head_size_refuses_two_by_name():
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, 1, 2, 16, 16, 8, d_v=4)
    from iosim.kernels import attention

    with pytest.raises(InputError, match="d_v=4"):
        attention(q, k, v)
    with pytest.raises(InputError, match="d_v=4"):
        optimize(["flash"], N=256, d=8, d_v=4, M=20_000, objective="dram", gpu="h100")
    with pytest.raises(InputError, match="d_v=4"):
        iosim.simulate_cascade("flash", q[:, :, :1], k, v, prefix=8, M=2000)
    with pytest.raises(InputError, match="k and v must agree"):
        iosim.simulate("flash", q, k[:, :, :8], v, M=2000)


def test_sdpa_with_its_own_v_head_size_agrees():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 2, 113, 239, 12, d_v=20)
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)),
                                                            is_causal=False).numpy()
    got = iosim.simulate("flash-swapped", q, k, v, M=3000).out
    assert relative_error(got, want) < 1e-12
