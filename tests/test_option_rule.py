"""One rule for an option that does not apply to an algorithm: the API and `run` refuse it by name; a sweep,
which covers many algorithms, passes it to those it applies to and says which ignored it."""

import numpy as np
import pytest
from helpers import random_qkv

import iosim
from iosim.cli import build_parser, main, run


@pytest.mark.parametrize("call", ["count", "predict"])
def test_the_api_refuses_a_block_mask_on_a_dense_algorithm(call):
    mask = iosim.BlockSparsity(0.5, "random", 0)
    with pytest.raises(
        iosim.InputError,
        match=r"block_sparsity for flash: it has no block mask; allowed: "
        r"block_sparsity=None, or an algorithm that takes one: \['block-sparse'",
    ):
        getattr(iosim, call)("flash", N=64, d=8, M="20k", block_sparsity=mask)
    assert iosim.count("block-sparse", N=64, d=8, M="20k", block_sparsity=mask).traffic.total > 0


def test_splits_reach_every_pass_of_a_training_step():
    with pytest.raises(iosim.InputError, match="splits=3 for flash backward at N_k=64; allowed: 1"):
        iosim.count("flash", N=64, d=8, M="20k", pass_="fwd+bwd", splits=3)
    q, k, v = random_qkv(np.random.default_rng(0), 1, 1, 16, 16, 4)
    with pytest.raises(iosim.InputError, match="splits=2 for flash backward"):
        iosim.gradients("flash", q, k, v, q, M=2000, splits=2)
    assert iosim.count("flash", N=64, d=8, M="20k", pass_="fwd+bwd", splits=1).traffic == \
        iosim.count("flash", N=64, d=8, M="20k", pass_="fwd+bwd").traffic


def test_run_refuses_splits_on_a_backward_pass_in_one_line(capsys):
    assert main(["run", "--N", "64", "--d", "8", "--pass", "bwd", "--splits", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["iosim: error: splits=2 for flash backward at N_k=64; allowed: 1"]


def test_a_sweep_says_which_algorithms_ignored_an_option(capsys):
    out = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--splits", "2", "--sparsity", "0.5",
                                         "--pass", "bwd"]))
    counted = {r.algorithm for r in out.rows}
    assert "split-kv" not in counted and "block-sparse" in counted
    splits, sparsity, left = out.notes
    assert splits.startswith("--splits 2 applies to split-kv only; ignored by standard, flash")
    assert sparsity.startswith("--sparsity 0.5 applies to block-sparse, block-sparse-skip only; ignored by standard")
    assert left == "--pass bwd: small-cache, split-kv have no backward pass and are not counted"
    assert main(["sweep", "--N", "256", "--d", "16", "--splits", "2", "--algo", "flash", "split-kv"]) == 0
    assert "--splits 2 applies to split-kv only; ignored by flash" in capsys.readouterr().out.replace("\n", " ")


def test_a_sweep_naming_only_algorithms_that_take_the_option_says_nothing():
    out = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--splits", "2", "--algo", "split-kv"]))
    assert out.notes == () and out.rows[0].tiling.splits == 2


def test_split_kv_fills_the_sms_of_the_preset_it_is_given():
    shape = dict(N=1, N_k=65536, d=128, M="100k")
    h100 = iosim.count("split-kv", **shape).tiling.splits
    a100 = iosim.count("split-kv", gpu="a100", **shape).tiling.splits
    assert h100 == iosim.count("split-kv", gpu="h100", **shape).tiling.splits
    assert a100 != h100, (a100, h100)
    rows = run(build_parser().parse_args(["sweep", "--N", "1", "--d", "128", "--gpu", "a100", "--algo", "split-kv"]))
    assert rows.rows[0].tiling.splits == iosim.count("split-kv", gpu="a100", N=1, d=128, M=rows.rows[0].M).tiling.splits


def test_a_given_tiling_with_splits_is_refused_by_an_algorithm_without_them():
    with pytest.raises(iosim.InputError, match="splits=2 for flash at N_k=256; allowed: 1"):
        iosim.count("flash", N=256, d=64, M="100k", tiling=iosim.Tiling(64, 64, splits=2))
    assert iosim.count("split-kv", N=256, d=64, M="100k", tiling=iosim.Tiling(64, 64, splits=2)).tiling.splits == 2


@pytest.mark.parametrize("flag, left", [(["--N", "1024", "--window", "128", "0"], "--window leaves out small-cache: it "
                                                                                 "takes no sliding window"),
                                        (["--seqlens", "100", "200"], "--seqlens leaves out split-kv: it takes no "
                                                                      "packed documents")])
def test_a_sweep_names_the_algorithms_an_option_leaves_out(flag, left, capsys):
    assert main(["sweep", "--d", "64", *flag]) == 0
    assert left in " ".join(capsys.readouterr().out.split())


def test_a_sweep_on_a_gpu_says_which_rows_the_l2_model_has_no_kernel_for():
    out = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--window", "31", "0", "--gpu", "h100",
                                         "--algo", "flash"]))
    assert out.notes == ("--gpu h100: the rows counted with this option have no DRAM bytes, their time is from HBM "
                         "bytes (window=(31, 0): no GPU kernel of iosim takes a sliding window, so the L2 model has no "
                         "grid for it; allowed: full attention, or causal (-1, 0))",)
    assert out.rows[0].dram is None
    causal = run(build_parser().parse_args(["sweep", "--N", "256", "--d", "16", "--window", "-1", "0", "--causal",
                                            "--gpu", "h100", "--algo", "flash"]))
    assert causal.notes == () and causal.rows[0].dram is not None  # (-1, 0) with causal: no sliding window
