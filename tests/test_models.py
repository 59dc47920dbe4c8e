"""Whole models (issue 18 item 5): presets against their config.json, totals from per-layer counts, config files,
the ``iosim model`` command."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

import iosim
from iosim.cli import build_parser, main, run
from iosim.core.gpus import resolve_M
from iosim.models.config import GLOBAL, LOCAL, LayerKind
from iosim.models.cost import layer_window
from iosim.models.hf_config import from_hf_config, load_config
from iosim.models.presets import PRESETS
from iosim.models.records import records

ROOT = Path(__file__).resolve().parent.parent
H100_M = resolve_M(None, "h100", "float16")  # 228 KiB of float16: 116,736 elements

# Written out by hand from each model's config.json (the URL), independently of iosim/models/presets.py:
# (num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings,
#  sliding_window of the local layers, how many layers are local)
PUBLISHED = {
    # n_layer 24, n_head 16, n_embd 1024 → 64, n_positions 1024
    "gpt2-medium": ("https://huggingface.co/openai-community/gpt2-medium/blob/main/config.json",
                    (24, 16, 16, 64, 1024, None, 0)),
    # hidden_size 4096 / 32 heads → 128
    "llama-3-8b": ("https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
                   (32, 32, 8, 128, 8192, None, 0)),
    # hidden_size 8192 / 64 heads → 128
    "llama-3-70b": ("https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json",
                    (80, 64, 8, 128, 8192, None, 0)),
    # every layer has the sliding window
    "mistral-7b": ("https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json",
                   (32, 32, 8, 128, 32768, 4096, 32)),
    # head_dim 256 given; gemma2 alternates local (even layers) and global
    "gemma-2-9b": ("https://huggingface.co/google/gemma-2-9b/blob/main/config.json",
                   (42, 16, 8, 256, 8192, 4096, 21)),
    # hidden_size 3584 / 28 heads → 128; use_sliding_window false
    "qwen2.5-7b": ("https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json",
                   (28, 28, 4, 128, 131072, None, 0)),
    # head_dim 64 given; 128-token windows on the even layers (transformers' GptOssConfig; its defaults are the
    # 120b's 36 layers, NVIDIA Megatron Bridge's gpt-oss page gives the 20b's 24)
    "gpt-oss-20b": ("https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
                    (24, 64, 8, 64, 131072, 128, 12)),
    "gpt-oss-120b": ("https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
                     (36, 64, 8, 64, 131072, 128, 18)),
}


def parse(*argv):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("name", PUBLISHED)
def test_preset_numbers_are_the_published_configs(name):
    url, (layers, heads, kv_heads, head_dim, context, window, local) = PUBLISHED[name]
    m = PRESETS[name]
    assert m.source == url
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.max_context) == (layers, heads, kv_heads, head_dim, context)
    assert m.sliding_window == window and sum(k.layers for k in m.kinds() if k.window is not None) == local
    assert sum(k.layers for k in m.kinds()) == layers


def test_gemma2_layers_alternate_local_first():
    types = PRESETS["gemma-2-9b"].layer_types
    assert types[:4] == (LOCAL, GLOBAL, LOCAL, GLOBAL) and types.count(LOCAL) == types.count(GLOBAL) == 21


def test_gpt_oss_layers_alternate_local_first_and_its_sinks_are_counted_where_a_pass_takes_them():
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        types = PRESETS[name].layer_types
        assert types[:4] == (LOCAL, GLOBAL, LOCAL, GLOBAL), (name, types[:4])
    report = iosim.model("gpt-oss-20b", N=256, phases=["prefill", "training"],
                         algorithms=["flash", "flash-swapped", "standard"])
    assert ("learned attention sinks (one logit a query head) are counted where the passes take them (prefill and "
            "decoding: flash, flash-swapped; training: flash, flash-swapped); the others are counted without them, and "
            "the DRAM bytes (and the times from them) are the layer's without its sinks, which no kernel the L2 model "
            "describes reads" in report.notes), report.notes
    phases = {p.phase.name: p for p in report.phases}
    for phase, sinks in ((phases["prefill"], {"flash": True, "flash-swapped": True, "standard": False}),
                         (phases["training"], {"flash": True, "flash-swapped": True, "standard": False})):
        for cost in phase.algorithms:
            for layer in cost.layers:
                assert ("sinks" in {t.name for t in layer.counts.tensors}) == sinks[cost.algorithm], (phase, cost)
                assert layer.exact, (phase.phase.name, cost.algorithm)
    # the DRAM bytes of a forward layer are those of the same layer without its sinks
    plain = iosim.model(replace(PRESETS["gpt-oss-20b"], sinks=False), N=256, phases=["prefill"],
                        algorithms=["flash-swapped"])
    with_sinks = next(c for c in phases["prefill"].algorithms if c.algorithm == "flash-swapped")
    global_layer = next(layer for layer in with_sinks.layers if layer.kind.window is None)
    assert global_layer.dram is not None
    assert global_layer.dram == next(layer.dram for layer in plain.phases[0].algorithms[0].layers
                                     if layer.kind.window is None)
    # a config of model_type gpt_oss is read as its preset is, sinks included
    published = {"model_type": "gpt_oss", "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "head_dim": 64, "sliding_window": 128, "max_position_embeddings": 131072,
                 "layer_types": ["sliding_attention", "full_attention"] * 12}
    mine = from_hf_config(published, source="config.json")
    assert (mine.layer_types, mine.sinks) == (PRESETS["gpt-oss-20b"].layer_types, True)
    assert not from_hf_config({**published, "model_type": "llama"}, source="config.json").sinks


def test_gpt2_medium_standard_prefill_bytes_by_hand():
    # GPT-2 medium, N = 1024, d = 64, 16 heads, batch 1, float16, H100 preset (M = 116,736), standard (Alg. 0):
    # fit's blocks: B_c = d = 64, and B_r the largest with Q_i, K_j, S_ij on chip: 128·B_r + 64·64 <= 116,736,
    # B_r = 880, so T_r = ⌈1024/880⌉ = 2; one softmax pass (113 rows of 1026 fit M).
    # Per head: S written, read, P written, read (4N² = 4,194,304), Q read and O written (2Nd = 131,072),
    # K and V read once per query block (2·T_r·N·d = 262,144): 4,587,520 elements, × 16 heads × 2 bytes
    # = 146,800,640 bytes a layer, × 24 layers = 3,523,215,360 bytes.
    report = iosim.model("gpt2-medium", N=1024, phases=["prefill"], algorithms=["standard"])
    (cost,) = report.phases[0].algorithms
    (layer,) = cost.layers
    assert (layer.forward_tiling.Br, layer.forward_tiling.Bc) == (880, 64)
    assert layer.counts.total_bytes == 146_800_640 and cost.total_bytes == 3_523_215_360
    assert layer.exact


def test_gpt2_medium_training_is_the_papers_table():
    # README's GPT-2 table (experiments/gpt2_table.py): batch 64, A100 preset, causal, dropout 0.1 (GPT-2's
    # attn_pdrop); one layer of the model is the table's attention
    table = json.loads((ROOT / "experiments" / "results" / "gpt2_table.json").read_text())
    expected = {
        r["algorithm"]: round(r["GB"] * 1e9) for r in table["rows"] if r["setting"].startswith("GPT-2 training")
    }
    report = iosim.model("gpt2-medium", N=1024, batch=64, gpu="a100", phases=["training"])
    got = {a.algorithm: a.layers[0].counts.total_bytes for a in report.phases[0].ran}
    assert got == expected and len(got) == 4
    skipped = {a.algorithm: a.skipped for a in report.phases[0].algorithms if a.skipped}
    assert set(skipped) == {"small-cache", "split-kv"} and all("no backward pass" in s for s in skipped.values())


def test_uniform_model_is_layers_times_one_layer():
    cfg = PRESETS["llama-3-8b"]
    report = iosim.model("llama-3-8b", N=3000, batch=2, phases=["prefill"])
    for cost in report.phases[0].ran:
        one = iosim.count(cost.algorithm, N=3000, d=128, M=H100_M, batch=2, heads=32, kv_heads=8, causal=True,
                          gpu="h100")
        assert cost.layers[0].counts == one.traffic
        assert cost.total_bytes == cfg.layers * one.traffic.total_bytes
        assert cost.flops == one.flops.scaled(cfg.layers)
        assert cost.seconds == pytest.approx(cfg.layers * cost.layers[0].roofline.seconds, rel=1e-12)


def test_alternating_model_sums_over_its_kinds():
    # at N <= 4096 Gemma 2's local layers equal causal attention: two kinds, each counted once
    report = iosim.model("gemma-2-9b", N=4096, context=4000)
    for pc in report.phases:
        for cost in pc.ran:
            assert [(c.kind.label, c.kind.layers) for c in cost.layers] == [("local 4096", 21), ("global", 21)]
            assert cost.total_bytes == sum(21 * c.counts.total_bytes for c in cost.layers)
            assert cost.flops == cost.layers[0].flops.scaled(21) + cost.layers[1].flops.scaled(21)
            assert all(c.window is None and c.exact for c in cost.layers)


def test_decode_is_one_query_against_the_context():
    report = iosim.model("qwen2.5-7b", N=2048, context=[1, 777, 32768], phases=["decode"])
    assert [pc.phase.n_k for pc in report.phases] == [1, 777, 32768]
    for pc in report.phases:
        for cost in pc.ran:
            one = iosim.count(cost.algorithm, N=1, N_k=pc.phase.n_k, d=128, M=H100_M, heads=28, kv_heads=4,
                              causal=True, gpu="h100")
            assert cost.layers[0].counts == one.traffic and cost.total_bytes == 28 * one.traffic.total_bytes


def test_training_with_grouped_heads_counts_kv_for_every_query_head():
    report = iosim.model("llama-3-8b", N=1000, phases=["training"], algorithms=["flash"])
    (cost,) = report.phases[0].algorithms
    both = iosim.count("flash", N=1000, d=128, M=H100_M, heads=32, causal=True, pass_="fwd+bwd", gpu="h100")
    assert cost.layers[0].kv_heads == 32 and cost.layers[0].counts == both.traffic
    assert any("repeat_kv" in note for note in report.notes)


def test_least_and_ratios():
    pc = iosim.model("llama-3-70b", N=8192, phases=["prefill"]).phases[0]
    assert pc.least.total_bytes == min(a.total_bytes for a in pc.ran) and pc.ratio(pc.least) == 1.0
    assert all(pc.ratio(a) >= 1.0 for a in pc.ran)


def test_window_applies_only_where_it_hides_keys():
    kind = LayerKind(4096, 32)
    assert layer_window(kind, 4096) is None and layer_window(LayerKind(None, 32), 10**6) is None
    assert layer_window(kind, 4097) == (4095, 0)  # Hugging Face's W keys, itself included: flash-attn (W−1, 0)


# --- config files -----------------------------------------------------------------------------------------------
LLAMA_3_8B = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "max_position_embeddings": 8192, "intermediate_size": 14336}


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_config_file_round_trip(tmp_path):
    cfg = load_config(write(tmp_path, LLAMA_3_8B))
    preset = PRESETS["llama-3-8b"]
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.max_context, cfg.kinds()) == (
        preset.layers, preset.heads, preset.kv_heads, preset.head_dim, preset.max_context, preset.kinds())
    a, b = (iosim.model(m, N=[1024, 4096], context=9000) for m in (cfg, "llama-3-8b"))
    assert [[x.total_bytes for x in pc.algorithms] for pc in a.phases] == \
           [[x.total_bytes for x in pc.algorithms] for pc in b.phases]


@pytest.mark.parametrize("extra, local", [
    ({"model_type": "gemma2", "sliding_window": 4096}, list(range(0, 32, 2))),
    ({"sliding_window": 4096}, list(range(32))),  # Mistral: every layer
    ({"sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28}, []),  # Qwen2
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 28}, [28, 29, 30, 31]),
    ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 0}, list(range(32))),
    ({"sliding_window": 512, "layer_types": [LOCAL, LOCAL, GLOBAL] * 10 + [GLOBAL] * 2}, [i for i in range(30)
                                                                                         if i % 3 != 2]),
    ({"sliding_window": None}, []),
])
def test_config_local_layers(tmp_path, extra, local):
    cfg = load_config(write(tmp_path, {**LLAMA_3_8B, **extra}))
    assert [i for i, t in enumerate(cfg.layer_types or (GLOBAL,) * 32) if t == LOCAL] == local


def test_gpt2_field_names_and_head_dim(tmp_path):
    gpt2 = {"model_type": "gpt2", "n_layer": 24, "n_head": 16, "n_embd": 1024, "n_positions": 1024,
            "attn_pdrop": 0.1}
    cfg = load_config(write(tmp_path, gpt2))
    p = PRESETS["gpt2-medium"]
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.max_context, cfg.dropout_p) == (
        p.layers, p.heads, p.kv_heads, p.head_dim, p.max_context, p.dropout_p)
    assert load_config(write(tmp_path, {**LLAMA_3_8B, "head_dim": 96})).head_dim == 96  # head_dim wins


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": None}, "num_attention_heads (or n_head) is missing"),
    ({"num_hidden_layers": None}, "num_hidden_layers (or n_layer) is missing"),
    ({"num_attention_heads": 0}, "num_attention_heads=0 must be a whole number >= 1"),
    ({"num_attention_heads": 32.5}, "num_attention_heads=32.5"),
    ({"num_key_value_heads": 5}, "num_key_value_heads=5 must divide num_attention_heads=32"),
    ({"hidden_size": 4100}, "hidden_size=4100 is not a multiple of num_attention_heads=32"),
    ({"hidden_size": None}, "hidden_size (or n_embd) is missing"),
    ({"head_dim": "128"}, "head_dim='128'"),
    ({"max_position_embeddings": 0}, "max_position_embeddings=0 must be a whole number >= 1"),
    ({"sliding_window": -1}, "sliding_window=-1"),
    ({"sliding_window": 4096, "use_sliding_window": "yes"}, "use_sliding_window='yes'"),
    ({"sliding_window": 1024, "sliding_window_pattern": 0}, "sliding_window_pattern=0 must be a whole number >= 1"),
    ({"sliding_window": 1024, "layer_types": [LOCAL] * 31}, "layer_types has 31 entries; num_hidden_layers=32"),
    ({"sliding_window": 1024, "layer_types": ["chunked_attention"] * 32}, "attention_chunk_size is missing or null"),
    ({"layer_types": ["linear_attention"] * 32}, "layer_types holds ['linear_attention']"),
    ({"kv_lora_rank": 512}, "qk_nope_head_dim is missing from the config; it is required"),
    ({"qk_rope_head_dim": 64}, "qk_rope_head_dim=64 without kv_lora_rank"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 128},
     "head_dim=128 contradicts qk_nope_head_dim + qk_rope_head_dim = 192"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": -1, "v_head_dim": 128},
     "qk_rope_head_dim=-1 must be a whole number >= 0"),
    ({"is_encoder_decoder": True}, "is_encoder_decoder=true"),
    ({"num_key_value_heads": None, "multi_query": "yes"}, "multi_query='yes' must be true or false"),
    ({"attention_chunk_size": 8192, "no_rope_layers": [1, 0]}, "no_rope_layers=[1, 0] must be a list of 0 and 1"),
    ({"layer_types": [LOCAL] * 32}, "sliding_window is missing or null"),
    ({"attention_dropout": 1.5}, "attention_dropout=1.5"),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers=1,000,000,000,000 is outside the allowed range [1, 100,000]"),
    ({"sliding_window": 4096, "max_window_layers": -1}, "max_window_layers=-1 must be a whole number >= 0"),
])
def test_bad_config_fields_are_named(tmp_path, change, message):
    config = {k: v for k, v in {**LLAMA_3_8B, **change}.items() if v is not None}
    with pytest.raises(iosim.InputError) as err:
        load_config(write(tmp_path, config))
    assert message in str(err.value)


def test_a_model_config_made_in_python_is_checked_as_a_file_is():
    from iosim.models.config import ModelConfig

    with pytest.raises(iosim.InputError, match="sinks='no' must be True or False"):
        ModelConfig("m", 2, 4, 2, 64, None, "here", sinks="no")
    with pytest.raises(iosim.InputError, match="attention_dropout='0.1' is outside the allowed range"):
        ModelConfig("m", 2, 4, 2, 64, None, "here", dropout_p="0.1")  # a TypeError before
    assert ModelConfig("m", 2, 4, 2, 64, None, "here", sinks=True).sinks
    # a window or a chunk that no layer takes was counted as global attention under notes that said local
    with pytest.raises(iosim.InputError, match="sliding_window=8 with no 'sliding_attention' layer in layer_types"):
        ModelConfig("m", 2, 4, 2, 64, None, "here", sliding_window=8)
    with pytest.raises(iosim.InputError, match="attention_chunk_size=512 with no 'chunked_attention' layer"):
        ModelConfig("m", 2, 4, 2, 64, None, "here", attention_chunk=512)
    for window in (-3, 0, 2.5, "8"):
        with pytest.raises(iosim.InputError, match=f"sliding_window={window!r} must be a whole number >= 1"):
            ModelConfig("m", 2, 4, 2, 64, None, "here", sliding_window=window, layer_types=(LOCAL, GLOBAL))
    with pytest.raises(iosim.InputError, match="attention_chunk_size=0 must be a whole number >= 1"):
        ModelConfig("m", 2, 4, 2, 64, None, "here", attention_chunk=0)
    local = ModelConfig("m", 2, 4, 2, 64, None, "here", sliding_window=8, layer_types=(LOCAL, GLOBAL))
    assert {k.window for k in local.kinds()} == {8, None}


def test_a_file_that_is_not_a_config(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(iosim.InputError, match="is not JSON"):
        load_config(tmp_path / "bad.json")
    with pytest.raises(iosim.InputError, match="a config.json holds an object"):
        load_config(write(tmp_path, [1, 2]))
    with pytest.raises(iosim.InputError, match="cannot be read"):
        load_config(tmp_path / "absent.json")
    with pytest.raises(iosim.InputError, match="a config.json holds an object"):
        from_hf_config("llama", source="text")
    with pytest.raises(iosim.InputError, match="must be a path to a config.json"):
        load_config(5)


# --- the command --------------------------------------------------------------------------------------------------
def test_cli_run_counts_and_saves_records(tmp_path):
    js, cs = tmp_path / "m.json", tmp_path / "m.csv"
    report = run(parse("model", "gemma-2-9b", "--N", "2048", "4Ki", "--context", "4000", "--gpu", "h200",
                       "--json", str(js), "--csv", str(cs)))
    assert [pc.phase.name for pc in report.phases] == ["training", "prefill", "training", "prefill", "decode"]
    assert report.gpu == "H200" and report.M == H100_M  # the same SM's shared memory
    saved = json.loads(js.read_text())
    assert saved == json.loads(json.dumps(records(report)))
    ok = [r for r in saved if r["status"] == "ok"]
    assert {r["layer_kind"] for r in ok} == {"local 4096", "global"} and all(r["exact"] for r in ok)
    first = next(r for r in ok if r["phase"] == "prefill" and r["algorithm"] == "flash")
    assert first["model_total_bytes"] == sum(r["total_bytes"] * r["layers"] for r in ok
                                             if (r["phase"], r["N"], r["algorithm"]) == ("prefill", 2048, "flash"))
    skipped = [r for r in saved if r["status"] != "ok"]
    assert {r["algorithm"] for r in skipped} == {"small-cache", "split-kv"}
    assert cs.read_text().count("\n") == len(saved) + 1


def test_cli_config_file(tmp_path):
    path = write(tmp_path, {**LLAMA_3_8B, "sliding_window": 2048})
    report = run(parse("model", "--config", str(path), "--N", "2048", "--phase", "decode", "--context", "2048"))
    assert report.model.source == str(path) and report.phases[0].ran


def test_main_prints_the_tables(capsys):
    assert main(["model", "llama-3-70b", "--N", "8Ki", "--algo", "flash", "flash-swapped", "split-kv"]) == 0
    text = capsys.readouterr().out
    assert "attention only: no MLP, no KV-cache capacity" in text
    assert "least HBM bytes (÷ least): flash-swapped" in text and "least HBM bytes (÷ least): split-kv" in text
    assert "not counted: split-kv: algorithm='split-kv' has no backward pass" in text
    flowing = " ".join(text.split())  # the lines as wrapped at 80 columns, joined
    assert "KV cache: 4.1KB a token a layer (K and V, 8 K/V heads × 128 × 2 B each), 328KB a token over 80 layers" \
        in flowing
    assert max(len(line) for line in text.splitlines()) <= 80
    assert main(["model", "llama-3-70b", "--N", "8Ki", "--algo", "flash", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "Σ DRAM" in wide and max(len(line) for line in wide.splitlines()) <= 130


def test_prefill_and_decoding_are_timed_from_dram_where_the_l2_model_covers_them():
    # the case: Llama-3-8B's 8k prefill, 168.8 MB a layer from DRAM, is compute-bound (578 µs), not
    # memory-bound at the HBM count's 2.8 GB
    report = iosim.model("llama-3-8b", N=8192, phases=("training", "prefill"), algorithms=["flash-swapped"])
    training, prefill = (p.ran[0].layers[0] for p in report.phases)
    assert training.time_from == "HBM" and training.dram is None  # a backward pass: the two-level bytes
    assert prefill.time_from == "DRAM" and prefill.dram.moved < prefill.counts.total_bytes / 10
    assert prefill.roofline.bound == "compute"
    (record,) = [r for r in records(report) if r["phase"] == "prefill"]
    assert record["time_from"] == "DRAM" and record["dram_read_bytes"] == prefill.dram.reads
    assert record["kv_cache_bytes_per_token"] == 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("argv, message", [
    (["model"], "give a model name"),
    (["model", "llama-3-8b", "--config", "x.json"], "not both"),
    (["model", "gpt-5"], "invalid choice"),
    (["model", "--config", "/nonexistent/config.json"], "cannot be read"),
    (["model", "llama-3-8b", "--gpu", "t4", "--dtype", "bfloat16"], "dtype='bfloat16' has no peak"),
    (["model", "llama-3-8b", "--M", "1MiB"], "more than the H100's shared memory"),
    (["model", "llama-3-8b", "--N", "0"], "argument --N"),
    (["model", "llama-3-8b", "--json", "/nonexistent/dir/x.json"], "does not exist"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


# --- local layers whose window hides keys ----------------------------------------------------------------------


def test_mistral_beyond_its_window_counts_the_band():
    # HF's sliding_window 4096: query i sees keys i − 4096 < j <= i, flash-attn's window (4095, 0)
    report = iosim.model("mistral-7b", N=8192, context=32768, algorithms=["flash", "flash-swapped", "standard"])
    for pc in report.phases:
        for cost in pc.ran:
            (layer,) = cost.layers
            one = iosim.count(cost.algorithm, N=pc.phase.n_q, N_k=pc.phase.n_k, d=128, M=H100_M, heads=32,
                              kv_heads=layer.kv_heads, causal=True, window=(4095, 0), pass_=pc.phase.pass_,
                              gpu="h100")
            assert layer.window == (4095, 0) and layer.counts == one.traffic and layer.exact
            assert cost.total_bytes == 32 * one.traffic.total_bytes
    prefill = report.phases[1].least
    full = iosim.model("llama-3-8b", N=8192, phases=["prefill"]).phases[0]
    assert prefill.total_bytes < next(a for a in full.ran if a.algorithm == prefill.algorithm).total_bytes


def test_gemma2_beyond_its_window_sums_a_banded_kind_and_a_global_kind():
    report = iosim.model("gemma-2-9b", N=8192, context=8192, algorithms=["flash-swapped"])
    for pc in report.phases:
        (cost,) = pc.ran
        local, glob = cost.layers
        assert (local.window, glob.window) == ((4095, 0), None)
        assert local.counts.total_bytes < glob.counts.total_bytes
        assert cost.total_bytes == 21 * (local.counts.total_bytes + glob.counts.total_bytes)


def test_an_algorithm_without_windows_is_listed_with_the_reason():
    pc = iosim.model("mistral-7b", N=8192, phases=["prefill"], algorithms=["flash", "small-cache"]).phases[0]
    assert [a.algorithm for a in pc.ran] == ["flash"]
    assert "window" in pc.algorithms[1].skipped


def test_the_report_says_split_kv_prefill_skips_causal_tiles_only_in_a_window():
    report = iosim.model("gemma-2-9b", N=8192, phases=("prefill",), algorithms=["flash-swapped", "split-kv"])
    assert any("split-kv is a decoding kernel" in note for note in report.notes)
    decode = iosim.model("gemma-2-9b", N=8192, phases=("decode",), algorithms=["split-kv"])
    assert not any("split-kv is a decoding kernel" in note for note in decode.notes)


def test_model_plot_draws_each_phase_and_a_bad_suffix_is_refused_before_any_work(tmp_path, capsys):
    from iosim.cli import main

    path = tmp_path / "gemma.png"
    assert main(["model", "gemma-3-27b", "--N", "4Ki", "--algo", "flash-swapped", "split-kv", "--plot",
                 str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["model", "gemma-3-27b", "--plot", str(tmp_path / "x.bogus")]) == 2
    assert "plot='" in capsys.readouterr().err and not (tmp_path / "x.bogus").exists()


def test_a_model_in_a_dtype_its_kernels_lack_says_its_rows_have_no_dram_bytes():
    bf16 = iosim.model("llama-3-8b", N=1024, gpu="h100", dtype="bfloat16", algorithms=["flash", "flash-swapped"],
                       phases=["prefill"])
    note = ("bfloat16: the kernels of flash, flash-swapped have no bfloat16 build, so their rows have no DRAM bytes "
            "and their times are from HBM bytes")
    assert note in bf16.notes

    def layers(report):
        return [c for pc in report.phases for a in pc.ran for c in a.layers]

    assert len(layers(bf16)) == 2 and all(c.dram is None for c in layers(bf16))
    fp16 = iosim.model("llama-3-8b", N=1024, gpu="h100", dtype="float16", algorithms=["flash", "flash-swapped"],
                       phases=["prefill"])
    assert not any("build" in n for n in fp16.notes)
    assert len(layers(fp16)) == 2 and all(c.dram is not None for c in layers(fp16))


def test_a_plot_of_a_model_with_nothing_counted_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "f.png"
    assert main(["model", "llama-3-8b", "--N", "1Ki", "--algo", "small-cache", "split-kv", "--phase", "training",
                 "--plot", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no algorithm was counted in any phase" in err[0] and not path.exists()


def test_the_plot_and_the_records_may_not_name_one_file(tmp_path, capsys):
    path = tmp_path / "p.png"
    assert main(["model", "llama-3-8b", "--N", "1Ki", "--phase", "decode", "--plot", str(path), "--json",
                 str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "json and plot name the same file" in err[0] and not path.exists()


def test_a_cut_model_run_keeps_the_records_of_the_phases_it_finished(tmp_path, monkeypatch):
    # the run is cut in its second phase (decode); the first (prefill) is finished, and its records are in the file
    from iosim.cli import model_cmd

    path = tmp_path / "m.json"
    args = build_parser().parse_args(["model", "llama-3-8b", "--N", "1Ki", "--phase", "prefill", "decode", "--algo",
                                      "flash", "standard", "--json", str(path)])
    seen = []

    def cut(cost):
        seen.append(cost)
        if len(seen) == 3:  # the first algorithm of the second phase
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model_cmd.run(args, on_row=cut)
    kept = json.loads(path.read_text())
    assert {(r["phase"], r["algorithm"]) for r in kept} == {("prefill", "flash"), ("prefill", "standard")}
    whole = model_cmd.run(build_parser().parse_args(["model", "llama-3-8b", "--N", "1Ki", "--phase", "prefill",
                                                     "--algo", "flash", "standard"]))
    assert kept == json.loads(json.dumps(records(whole)))  # the same records as the phase run alone


def test_the_block_mask_note_names_only_what_is_left_out_or_counted_dense(capsys):
    # by default the block-sparse ones and flex are left out, and the note says so; asked for, block-sparse is
    # counted dense (a model has no block mask), and the note says that instead of "not counted"
    assert main(["model", "llama-3-8b", "--N", "1Ki", "--phase", "decode", "--algo", "flash"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "need a block mask" not in out and "counted without a block mask" not in out
    assert main(["model", "llama-3-8b", "--N", "1Ki", "--phase", "decode", "--algo", "block-sparse", "flash"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "block-sparse: counted without a block mask" in out and "not counted, they need" not in out
    default = iosim.model("llama-3-8b", N=1024, phases="decode").notes
    assert any("block-sparse, block-sparse-skip, flex: not counted" in n for n in default)


def test_a_model_run_that_counts_nothing_says_so_and_exits_2(capsys):
    # M = 1 element fits no algorithm's working set: every row is refused, each with its reason printed
    argv = ["model", "llama-3-8b", "--N", "1Ki", "--algo", "flash", "standard", "--phase", "decode"]
    assert main([*argv, "--M", "1"]) == 2
    out, err = capsys.readouterr()
    assert "not counted: flash: M=1 is below the smallest working set" in " ".join(out.split())
    err = err.strip().splitlines()
    assert len(err) == 1 and "no algorithm was counted in any phase" in err[0], err
    assert main([*argv, "--M", "1Ki"]) == 0


def test_the_model_api_takes_one_name_as_a_list_and_refuses_no_names_by_name():
    one = iosim.model("llama-3-8b", N=1024, algorithms="flash", phases="decode")
    assert [(pc.phase.name, a.algorithm) for pc in one.phases for a in pc.ran] == [("decode", "flash")]
    twice = iosim.model("llama-3-8b", N=1024, algorithms=["flash", "flash"], phases=["decode", "decode"])
    assert [(pc.phase.name, a.algorithm) for pc in twice.phases for a in pc.ran] == [("decode", "flash")]
    for given, message in ((dict(phases=None), "phases=None: give one name"), (dict(phases=[]), "phases=\\[\\]"),
                           (dict(algorithms=[]), "algorithms=\\[\\]"), (dict(algorithms=[1]), "algorithms=\\[1\\]"),
                           (dict(on_step=5), "on_step=5 is not callable"),
                           (dict(on_phase=5), "on_phase=5 is not callable"),
                           (dict(phases=["decode", "serve"]), r"phase='serve' is not one of \['decode', 'prefill', "
                                                              r"'training'\]"),
                           (dict(algorithms=["flash3"]), "algorithm='flash3' is not one of")):
        with pytest.raises(iosim.InputError, match=message):
            iosim.model("llama-3-8b", N=1024, **given)


@pytest.mark.parametrize("phases, message", [
    (["training"], "context=[100] with phases=['training']: only decoding reads a context"),
    (["training", "prefill"], "context=[100] with phases=['training', 'prefill']: only decoding reads a context"),
])
def test_a_context_no_phase_counted_reads_is_refused_not_ignored(capsys, phases, message):
    assert main(["model", "llama-3-8b", "--N", "4Ki", "--context", "100", "--phase", *phases]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
