"""Published Hugging Face configs of fifteen model families, read as their attention is (issue 30, item 2).

tests/data/hf_configs/ holds each family's config.json as published, its URL in ``_source``: the fields that shape
attention and a few beside them. What each must read as is the model's architecture as its paper or transformers'
modelling code states it (Falcon-7B multi-query: one K/V head; Falcon-40B eight; Llama 4 chunked on three layers of
four), independent of iosim's reading rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import iosim
from iosim.models.config import CHUNKED, GLOBAL, LOCAL
from iosim.models.cost import model
from iosim.models.hf_config import load_config

DATA = Path(__file__).parent / "data" / "hf_configs"

# file: layers, heads, K/V heads, head dim, max context (None: the config states none), {layer type: count}, chunk
EXPECTED = {
    "falcon-7b": (32, 71, 1, 64, None, {GLOBAL: 32}, None),
    "falcon-40b": (60, 128, 8, 64, None, {GLOBAL: 60}, None),
    "llama-4-scout": (48, 40, 8, 128, 10485760, {CHUNKED: 36, GLOBAL: 12}, 8192),
    "phi-3-mini-4k": (32, 32, 32, 96, 4096, {LOCAL: 32}, None),
    "mixtral-8x7b": (32, 32, 8, 128, 32768, {GLOBAL: 32}, None),
    "gpt-neox-20b": (44, 64, 64, 96, 2048, {GLOBAL: 44}, None),
    "gpt-j-6b": (28, 16, 16, 256, 2048, {GLOBAL: 28}, None),
    "opt-6.7b": (32, 32, 32, 128, 2048, {GLOBAL: 32}, None),
    "bloom-7b1": (30, 32, 32, 128, None, {GLOBAL: 30}, None),
    "qwen1.5-moe-a2.7b": (24, 16, 16, 128, 8192, {GLOBAL: 24}, None),
    "starcoder": (40, 48, 1, 128, 8192, {GLOBAL: 40}, None),
    "qwen3-8b": (36, 32, 8, 128, 40960, {GLOBAL: 36}, None),
    # Gemma 3: every sixth layer global (transformers' Gemma3TextConfig: layer i is full attention when (i + 1) % 6 is
    # 0): layers 6, 12, …, 60 of 62. Its config states no max_position_embeddings
    "gemma-3-27b-it": (62, 32, 16, 128, None, {LOCAL: 52, GLOBAL: 10}, None),
    # multi-head latent attention: a head of Q and K is qk_nope_head_dim 128 + qk_rope_head_dim 64 (DeepSeek-V3's
    # paper, section 2.1.1: d_h + d_h^R)
    "deepseek-v3": (61, 128, 128, 192, 163840, {GLOBAL: 61}, None),
    "kimi-k2-instruct": (61, 64, 64, 192, 131072, {GLOBAL: 61}, None),
}
# MLA's sizes: V's head (v_head_dim), and the latent a token that decoding reads: kv_lora_rank + qk_rope_head_dim
LATENT = {"deepseek-v3": (128, 576, 512), "kimi-k2-instruct": (128, 576, 512)}


def test_every_stored_config_is_checked_and_cites_its_source():
    stored = sorted(p.stem for p in DATA.glob("*.json"))
    assert stored == sorted(EXPECTED)
    for p in DATA.glob("*.json"):
        assert json.loads(p.read_text())["_source"].startswith("https://huggingface.co/")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_published_config_reads_as_its_architecture(name):
    layers, heads, kv_heads, head_dim, context, types, chunk = EXPECTED[name]
    cfg = load_config(DATA / f"{name}.json")
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.max_context) == (layers, heads, kv_heads, head_dim,
                                                                                    context)
    assert {t: cfg.layer_types.count(t) for t in set(cfg.layer_types)} == types
    assert cfg.attention_chunk == chunk


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_published_config_counts_exactly_at_a_given_length(name):
    cfg = load_config(DATA / f"{name}.json")
    report = model(cfg, N=4096, phases=("prefill", "decode"), algorithms=["flash-swapped", "split-kv"])
    for phase in report.phases:
        ran = phase.ran
        assert ran and all(c.exact for a in ran for c in a.layers)


def test_falcon_decoding_reads_one_kv_head_not_seventy_one():
    falcon = load_config(DATA / "falcon-7b.json")
    (layer,) = model(falcon, N=2048, phases=("decode",), algorithms=["split-kv"]).phases[0].ran[0].layers
    kv_read = sum(layer.counts.tensor(x).read_bytes for x in ("K", "V"))
    assert layer.kv_heads == 1 and kv_read == 2 * 2048 * 64 * 2  # K and V of one head, float16, once


def test_a_config_without_max_position_embeddings_needs_n():
    falcon = load_config(DATA / "falcon-7b.json")
    with pytest.raises(iosim.InputError, match="states no max_position_embeddings"):
        model(falcon)


def test_llama4_chunked_layers_are_their_chunks():
    scout = load_config(DATA / "llama-4-scout.json")
    (chunked,) = [k for k in scout.kinds() if k.chunk is not None]
    assert chunked.layers == 36 and chunked.label == "chunked 8192"
    report = model(scout, N=3 * 8192 + 100, phases=("prefill", "decode"), algorithms=["flash-swapped"])
    prefill, decode = (p.ran[0] for p in report.phases)
    by_kind = {c.kind.label: c for c in prefill.layers}
    docs = iosim.count("flash-swapped", seqlens=[8192, 8192, 8192, 100], d=128, heads=40, kv_heads=8, causal=True,
                       M=report.M)
    assert by_kind["chunked 8192"].counts.total_bytes == docs.traffic.total_bytes
    last = {c.kind.label: c for c in decode.layers}["chunked 8192"]
    one = iosim.count("flash-swapped", N=1, N_k=100, d=128, heads=40, kv_heads=8, causal=True, M=report.M)
    assert last.counts.total_bytes == one.traffic.total_bytes  # the new token's chunk holds 100 keys


@pytest.mark.parametrize("name", sorted(LATENT))
def test_an_mla_config_reads_its_latent_and_decodes_from_it(name):
    d_v, d, latent_v = LATENT[name]
    cfg = load_config(DATA / f"{name}.json")
    assert (cfg.d_v, *cfg.latent_heads()) == (d_v, d, latent_v)
    report = model(cfg, N=4096, phases=("prefill", "decode"), algorithms=["flash-swapped", "split-kv"])
    prefill, decode = report.phases
    (expanded,) = next(a for a in prefill.ran if a.algorithm == "flash-swapped").layers
    assert (expanded.kv_heads, expanded.d, expanded.d_v, expanded.latent) == (cfg.heads, 192, 128, False)
    # K and V meet the same query blocks: their reads are in the ratio of their head sizes, 192 to 128
    assert expanded.counts.tensor("K").reads * 128 == expanded.counts.tensor("V").reads * 192
    (layer,) = next(a for a in decode.ran if a.algorithm == "split-kv").layers
    assert (layer.kv_heads, layer.d, layer.d_v, layer.latent) == (1, 576, 512, True)
    assert "V" not in {t.name for t in layer.counts.tensors}
    # every split reads its share of the latent once for each query block of the packed heads
    query_blocks = -(-cfg.heads // layer.forward_tiling.Br)
    assert layer.counts.tensor("K").reads == query_blocks * 4096 * 576


@pytest.mark.parametrize("preset, stored", [("qwen3-8b", "qwen3-8b"), ("gemma-3-27b", "gemma-3-27b-it"),
                                            ("deepseek-v3", "deepseek-v3"), ("kimi-k2", "kimi-k2-instruct")])
def test_a_preset_is_its_published_config(preset, stored):
    from iosim.models.presets import get_model

    mine, published = get_model(preset), load_config(DATA / f"{stored}.json")
    fields = ("layers", "heads", "kv_heads", "head_dim", "sliding_window", "attention_chunk", "v_head_dim",
              "kv_lora_rank", "qk_rope_head_dim")
    assert [getattr(mine, f) for f in fields] == [getattr(published, f) for f in fields]
    assert mine.kinds() == published.kinds()
    # Gemma 3's config states no max_position_embeddings; the preset takes Gemma3TextConfig's default
    assert mine.max_context == (published.max_context or 131072)
