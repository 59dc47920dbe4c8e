"""Multi-head latent attention's decode with its projections absorbed (DeepSeek-V2/V3, FlashMLA): one latent K per
token shared by every query head, V its first d_v columns (``Problem.latent``).

split-kv and flash-swapped take it in their forward pass: they load K_j and use its first d_v columns as V_j, with no
read and no SRAM of their own. Held here: outputs against float64 on awkward shapes; every count equal to its closed
form (Hypothesis); the latent cache reading K alone, once per query block, where separate K and V read d + d_v a key;
everything else refused by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import main as cli_main
from iosim.core.errors import InputError

TAKERS = ("flash-swapped", "split-kv")


def latent_qkv(rng, batch: int, heads: int, n_q: int, n_k: int, d: int, d_v: int):
    """q of ``heads`` heads against one latent K/V head: k of d columns, v its first d_v."""
    q = rng.standard_normal((batch, heads, n_q, d))
    k = rng.standard_normal((batch, 1, n_k, d))
    return q, k, k[..., :d_v].copy()


@pytest.mark.parametrize("algo", TAKERS)
@pytest.mark.parametrize("n_q, n_k, d, d_v, heads, options", [
    (1, 1, 3, 2, 1, {}),
    (1, 239, 24, 16, 8, {}),
    (2, 113, 9, 9, 4, dict(causal=True)),  # d_v = d: V is the whole latent
    (3, 239, 20, 13, 2, dict(page_size=16, causal=True)),
    (1, 300, 12, 8, 16, dict(window=(64, 0))),
], ids=["N=1", "decode", "d_v=d,causal", "paged,speculative", "window"])
def test_latent_runs_match_float64_and_their_closed_form(algo, n_q, n_k, d, d_v, heads, options):
    rng = np.random.default_rng(n_k + heads)
    q, k, v = latent_qkv(rng, 2, heads, n_q, n_k, d, d_v)
    got = iosim.simulate(algo, q, k, v, M=4000, latent=True, **options)
    ref = iosim.attention_ref(q, k, v, causal=options.get("causal", False), window=options.get("window"))
    np.testing.assert_allclose(got.out, ref.out, rtol=0, atol=1e-12)
    sizes = dict(N=n_q, N_k=n_k, d=d, d_v=d_v, batch=2, heads=heads, kv_heads=1, M=4000, **options)
    counted = iosim.count(algo, latent=True, **sizes)
    assert got.traffic == counted.traffic == iosim.predict(algo, latent=True, **sizes).exact
    assert got.flops == counted.flops
    names = [t.name for t in counted.traffic.tensors]
    assert "V" not in names and "K" in names  # the latent cache is one tensor


def test_split_kv_reads_each_latent_row_once_for_every_head():
    # DeepSeek-V3's decode: 128 query heads on one latent of d = 576 (512 + 64 RoPE), d_v = 512. With M large enough
    # for the 128 packed rows in one query block, each split reads its share of K once: N_k·576 over the splits; the
    # same shapes with V apart read N_k·(576 + 512)
    n_k = 4096
    sizes = dict(N=1, N_k=n_k, d=576, d_v=512, heads=128, kv_heads=1, M="2Mi", splits=8)
    latent = iosim.count("split-kv", latent=True, **sizes).traffic
    apart = iosim.count("split-kv", **sizes).traffic
    assert latent.tensor("K").reads == n_k * 576
    assert apart.tensor("K").reads + apart.tensor("V").reads == n_k * (576 + 512)
    assert apart.total - latent.total == n_k * 512  # V's reads, and nothing else
    assert latent.peak_sram < apart.peak_sram  # V_j holds no SRAM of its own


@settings(max_examples=150, deadline=None)
@given(algo=st.sampled_from(TAKERS), n_q=st.integers(1, 64), n_k=st.integers(1, 70000), d=st.integers(1, 600),
       data=st.data(), heads=st.sampled_from([1, 4, 16, 128]), causal=st.booleans(),
       page=st.sampled_from([None, 1, 16, 64]), M=st.integers(200, 2_000_000), sinks=st.booleans())
def test_latent_counts_equal_their_closed_form(algo, n_q, n_k, d, data, heads, causal, page, M, sinks):
    d_v = data.draw(st.integers(1, d))
    sizes = dict(N=n_q, N_k=n_k, d=d, d_v=d_v, heads=heads, kv_heads=1, M=M, causal=causal, page_size=page,
                 sinks=sinks, latent=True)
    try:
        counted = iosim.count(algo, **sizes)
    except iosim.BlockSizeError:
        reject()
    assert counted.traffic == iosim.predict(algo, **sizes).exact, f"{algo} {sizes} {counted.tiling}"
    assert counted.traffic.peak_sram <= counted.M


def test_what_reads_v_apart_refuses_the_latent_cache_by_name(capsys):
    with pytest.raises(InputError, match=r"latent for flash, pass 'fwd': it reads V apart from K"):
        iosim.count("flash", N=1, N_k=64, d=24, d_v=16, M=3000, latent=True)
    with pytest.raises(InputError, match=r"latent for flash-swapped, pass 'fwd\+bwd'"):
        iosim.count("flash-swapped", N=8, d=24, d_v=16, M=3000, latent=True, pass_="fwd+bwd")
    with pytest.raises(InputError, match=r"latent with d_v=32 > d=24"):
        iosim.count("split-kv", N=1, N_k=64, d=24, d_v=32, M=3000, latent=True)
    rng = np.random.default_rng(1)
    q, k, v = latent_qkv(rng, 1, 2, 1, 40, 8, 4)
    with pytest.raises(InputError, match=r"allowed: v equal to k\[..., :d_v\]"):
        iosim.simulate("split-kv", q, k, v + 1.0, M=2000, latent=True)
    assert cli_main(["run", "--algo", "flash-swapped", "--N", "1", "--d", "8", "--d-v", "4", "--latent", "--pass",
                     "bwd"]) == 2
    assert "--latent with --pass bwd" in capsys.readouterr().err


def test_a_sweep_with_the_latent_cache_counts_its_takers_and_says_which_it_left_out(tmp_path):
    from iosim.cli import build_parser, run

    out = tmp_path / "sweep.json"
    outcome = run(build_parser().parse_args(["sweep", "--N", "1", "--N-k", "4096", "--d", "576", "--d-v", "512",
                                             "--heads", "16", "--kv-heads", "1", "--latent", "--gpu", "h100",
                                             "--json", str(out)]))
    assert sorted(r.algorithm for r in outcome.rows) == sorted(TAKERS)
    assert outcome.notes[0] == ("--latent leaves out standard, flash, standard-eager, small-cache: they take no latent "
                                "cache")
    assert "latent: no kernel the L2 model describes reads MLA's latent cache" in outcome.notes[1]
    records = json.loads(out.read_text())
    assert all(r["latent"] is True and r["d_v"] == 512 and r["status"] == "ok" and r["ratio"] == 1.0
               for r in records)
    assert all(t["name"] != "V" for r in records for t in r["tensors"])


def test_a_model_with_latent_attention_reports_its_latent_cache_bytes(capsys):
    from iosim.models.records import records

    # DeepSeek-V3: one latent of 512 and a RoPE key of 64 a token a layer, float16, over 61 layers; a GQA model of the
    # same heads would keep 2·kv_heads·head_dim
    report = iosim.model("deepseek-v3", N=1024, phases=["decode"], algorithms=["split-kv", "flash"])
    (record, *_) = records(report)
    assert record["kv_cache_bytes_per_token_layer"] == 576 * 2
    assert record["kv_cache_bytes_per_token"] == 61 * 576 * 2
    (decode,) = report.phases
    assert [a.algorithm for a in decode.ran] == ["split-kv"]
    assert "latent for flash, pass 'fwd'" in next(a.skipped for a in decode.algorithms if a.algorithm == "flash")
    assert cli_main(["model", "deepseek-v3", "--N", "1024", "--phase", "decode", "--algo", "split-kv"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("KV cache: 1.15KB a token a layer (one latent of 512 and a RoPE key of 64, × 2 B, shared by every head)"
            in out)


def test_a_latent_cache_with_nan_is_taken_where_nonfinite_inputs_are(capsys):
    rng = np.random.default_rng(3)
    q, k, v = latent_qkv(rng, 1, 4, 3, 20, 8, 4)
    k[0, 0, 5, 0] = np.nan
    v = k[..., :4].copy()  # the latent's NaN is V's too
    got = iosim.simulate("split-kv", q, k, v, M=4000, latent=True, allow_nonfinite=True)
    assert np.isnan(got.out).any()
    with pytest.raises(InputError, match="non-finite"):  # and refused, as every input is, without the flag
        iosim.simulate("split-kv", q, k, v, M=4000, latent=True)
    assert cli_main(["run", "--algo", "split-kv", "--N", "1", "--d", "8", "--d-v", "16", "--latent"]) == 2
    assert "--latent with --d-v 16 > --d 8" in capsys.readouterr().err


def test_an_mla_config_with_grouped_kv_heads_is_refused_as_contradictory():
    from iosim.models.hf_config import from_hf_config

    config = {"num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 2, "kv_lora_rank": 512,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    with pytest.raises(InputError, match="num_key_value_heads=4 with kv_lora_rank=512"):
        from_hf_config(config, source="config.json")
