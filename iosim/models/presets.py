"""Whole models' attention, as declarative data: presets of published models and Hugging Face config files.

A model, to iosim, is the attention of each of its layers: how many query heads, how
many K/V heads (grouped-query attention), the head dimension, and whether the layer
attends to every earlier key (a global layer) or to a sliding window of the last W keys
(a local layer). Everything else a model has (the MLP, the norms, the embeddings, the
KV cache's capacity) is out of scope: ``iosim.models.cost`` counts attention only.

Each preset's numbers come from the model's published ``config.json`` on the Hugging
Face Hub, cited by URL beside it. ``from_hf_config`` reads such a file (the user passes
it; nothing is downloaded) with these fields:

- ``num_attention_heads`` (GPT-2: ``n_head``), ``num_hidden_layers`` (``n_layer``):
  required;
- ``num_key_value_heads``: default ``num_attention_heads`` (multi-head attention); without it, Falcon's fields as
  transformers' FalconAttention reads them (``num_kv_heads`` (``n_head_kv``) where ``new_decoder_architecture`` is
  true or ``multi_query`` false, else one; ``multi_query`` defaults to true for Falcon), and GPT-BigCode's
  ``multi_query: true`` (one);
- a multimodal config's ``text_config`` (Llama 4), where the top level has no ``num_attention_heads``;
- ``head_dim``, else ``hidden_size`` (``n_embd``) / ``num_attention_heads``; ``v_head_dim``, V's head size where
  it differs (default ``head_dim``);
- multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): ``kv_lora_rank``, with ``qk_nope_head_dim``,
  ``qk_rope_head_dim`` and ``v_head_dim``, all required beside it: a head of Q and K is qk_nope_head_dim +
  qk_rope_head_dim (a ``head_dim`` field may say that or, as transformers' DeepseekV3Config writes it,
  qk_rope_head_dim; anything else is refused as contradictory), and decoding reads one latent of kv_lora_rank +
  qk_rope_head_dim a token (``ModelConfig.latent_heads``); ``qk_nope_head_dim`` or ``qk_rope_head_dim`` without
  ``kv_lora_rank`` is refused;
- ``max_position_embeddings`` (``n_positions``): the longest context it was trained for,
  the default sequence length; a config without one (Falcon, BLOOM) needs N given;
- ``attention_chunk_size`` C (Llama 4): the layers that use RoPE (``no_rope_layers``, 1 a layer; default every
  layer but each ``no_rope_layer_interval``-th, 4) attend within their C-token chunk (``chunked_attention``);
- ``attention_dropout`` (``attn_pdrop``): the attention dropout of a training step, default 0;
- ``sliding_window``: W, the keys a local layer sees, itself included (Hugging Face's
  convention: query i sees key j when i − W < j ≤ i, flash-attn's ``window_size=(W − 1, 0)``);
  which layers are local:
  - ``layer_types``, one entry a layer, "sliding_attention" or "full_attention";
  - else ``sliding_window_pattern`` P (Gemma 3; its published configs state none, and ``model_type`` "gemma3" or
    "gemma3_text" takes transformers' default, 6): every P-th layer global, the others local (transformers'
    Gemma3TextConfig: layer i local where (i + 1) mod P is not 0);
  - else ``model_type`` "gemma2": layers 0, 2, 4, ... local, the others global (transformers'
    ``Gemma2Attention``: ``is_sliding = not layer_idx % 2``);
  - else ``use_sliding_window: false`` (Qwen2) makes every layer global, and with it true,
    layers from ``max_window_layers`` on are local (transformers' Qwen2 rule);
  - else every layer is local (Mistral).
  An entry of ``layer_types`` other than the three kinds is refused by name: iosim does not guess them.

Fields that shape attention in a way iosim does not count (``UNMODELLED``: GPT-Neo's ``attention_types``,
``cross_attention_layers``) and ``is_encoder_decoder: true`` are refused by name. A ``model_type`` whose attention
has learned sinks, a weight no config field names (gpt-oss, ``SINK_TYPES``), is read with them
(``ModelConfig.sinks``).

GPT-2's field names are those its ``GPT2Config.attribute_map`` maps to the common ones.
A missing or malformed field raises ``iosim.InputError`` naming it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from iosim.core.errors import InputError

# Hugging Face's names of a layer's attention (layer_types)
GLOBAL, LOCAL, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


def _check_count(name: str, value, least: int = 1) -> int:
    if type(value) is not int or value < least:
        raise InputError(f"{name}={value!r} must be a whole number >= {least}")
    return value


@dataclass(frozen=True)
class LayerKind:
    """The attention of a group of layers that count the same: a global layer, a local one of window W, or a chunked
    one of chunk C (Llama 4: a query sees the earlier keys of its own C-token chunk)."""

    window: int | None  # W, the keys a query sees, itself included (HF's sliding_window); None: every earlier key
    layers: int  # how many of the model's layers are of this kind
    chunk: int | None = None  # C, HF's attention_chunk_size, on a chunked layer

    @property
    def label(self) -> str:
        if self.chunk is not None:
            return f"chunked {self.chunk}"
        return "global" if self.window is None else f"local {self.window}"


@dataclass(frozen=True)
class ModelConfig:
    """The attention of one decoder model, every layer causal. Numbers as its config.json states them."""

    name: str
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads: K/V heads shared by the query heads (grouped-query attention)
    head_dim: int  # head_dim, or hidden_size / num_attention_heads
    max_context: int | None  # max_position_embeddings; None where the config has none (then N must be given)
    source: str  # where the numbers come from: the config.json's URL, or the file given
    sliding_window: int | None = None  # W of the local layers; None when no layer is local
    layer_types: tuple[str, ...] = ()  # GLOBAL, LOCAL or CHUNKED, one a layer; () means every layer GLOBAL
    dropout_p: float = 0.0  # attention_dropout, applied in a training step only
    attention_chunk: int | None = None  # C of the chunked layers (attention_chunk_size); None when none is chunked
    sinks: bool = False  # learned attention sinks, one logit a query head (gpt-oss; Problem.sinks)
    v_head_dim: int | None = None  # V's head size where it differs from head_dim (Q's and K's); None: head_dim
    # multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): K and V come from one latent of this rank a token, and a
    # RoPE key of qk_rope_head_dim shared by every head; head_dim is then qk_nope_head_dim + qk_rope_head_dim
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    def __post_init__(self):
        for name in ("layers", "heads", "kv_heads", "head_dim"):
            _check_count(name, getattr(self, name))
        for name, least in (("v_head_dim", 1), ("kv_lora_rank", 1), ("qk_rope_head_dim", 0)):
            if getattr(self, name) is not None:
                _check_count(name, getattr(self, name), least)
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise InputError(f"kv_lora_rank={self.kv_lora_rank!r} with qk_rope_head_dim={self.qk_rope_head_dim!r}: "
                             f"multi-head latent attention needs both, other attention neither")
        if self.mla and not self.qk_rope_head_dim < self.head_dim:
            raise InputError(f"qk_rope_head_dim={self.qk_rope_head_dim} of a head of {self.head_dim}: the RoPE key is "
                             f"part of the head, beside qk_nope_head_dim >= 1")
        if self.max_context is not None:
            _check_count("max_position_embeddings", self.max_context)
        if self.heads % self.kv_heads:
            raise InputError(f"num_key_value_heads={self.kv_heads} must divide num_attention_heads={self.heads}")
        if self.layer_types and len(self.layer_types) != self.layers:
            raise InputError(f"layer_types has {len(self.layer_types)} entries; num_hidden_layers={self.layers}")
        unknown = sorted(set(self.layer_types) - {GLOBAL, LOCAL, CHUNKED})
        if unknown:
            raise InputError(f"layer_types holds {unknown}; iosim counts {GLOBAL!r}, {LOCAL!r} and {CHUNKED!r} layers")
        if LOCAL in self.layer_types:
            _check_count("sliding_window", self.sliding_window)
        if CHUNKED in self.layer_types:
            _check_count("attention_chunk_size", self.attention_chunk)
        if not 0 <= self.dropout_p < 1:
            raise InputError(f"attention_dropout={self.dropout_p!r} is outside the allowed range [0, 1)")

    def kinds(self) -> tuple[LayerKind, ...]:
        """The distinct kinds of layer and how many layers each: what is counted once and multiplied."""
        counts = Counter(self.layer_types or (GLOBAL,) * self.layers)
        return tuple(LayerKind(self.sliding_window if kind == LOCAL else None, counts[kind],
                               self.attention_chunk if kind == CHUNKED else None)
                     for kind in (LOCAL, CHUNKED, GLOBAL) if counts[kind])

    @property
    def grouped(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention: K and V from one latent a token (``kv_lora_rank``)."""
        return self.kv_lora_rank is not None

    @property
    def d_v(self) -> int:
        """V's head size: v_head_dim, else head_dim."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    def latent_heads(self) -> tuple[int, int]:
        """(d, d_v) of MLA's decode with the projections absorbed (FlashMLA): every query head against one latent of
        kv_lora_rank and the RoPE key, d = kv_lora_rank + qk_rope_head_dim, and V the latent alone,
        d_v = kv_lora_rank."""
        if not self.mla:
            raise ValueError(f"{self.name} has no latent attention")
        return self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank


def uniform(layers: int, kind: str = GLOBAL) -> tuple[str, ...]:
    return (kind,) * layers


GEMMA3, GEMMA3_PATTERN = ("gemma3", "gemma3_text"), 6  # transformers' Gemma3TextConfig: sliding_window_pattern=6


def pattern_layers(pattern: int, layers: int) -> tuple[str, ...]:
    """Gemma 3's layers: every ``pattern``-th global, the others local (transformers' Gemma3TextConfig: layer i is
    "sliding_attention" where (i + 1) mod sliding_window_pattern is not 0)."""
    return tuple(LOCAL if (i + 1) % pattern else GLOBAL for i in range(layers))


def alternating(layers: int) -> tuple[str, ...]:
    """Local first, then global, alternating: Gemma 2's layers (transformers' ``is_sliding = not layer_idx % 2``) and
    gpt-oss's (transformers' GptOssConfig: layer i "sliding_attention" where (i + 1) mod 2 is not 0)."""
    return tuple(LOCAL if i % 2 == 0 else GLOBAL for i in range(layers))


HF = "https://huggingface.co"
# model_type of the models whose attention has learned sinks, a weight (self_attn.sinks) no config field names
SINK_TYPES = ("gpt_oss",)

# Every number below is the model's config.json at the URL beside it; head_dim is hidden_size / num_attention_heads
# where the file has no head_dim field.
PRESETS: dict[str, ModelConfig] = {
    # n_layer 24, n_head 16, n_embd 1024 (head_dim 64), n_positions 1024, attn_pdrop 0.1: the paper's GPT-2 medium
    "gpt2-medium": ModelConfig("GPT-2 medium", layers=24, heads=16, kv_heads=16, head_dim=64, max_context=1024,
                               source=f"{HF}/openai-community/gpt2-medium/blob/main/config.json", dropout_p=0.1),
    # num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128),
    # max_position_embeddings 8192
    "llama-3-8b": ModelConfig("Llama-3-8B", layers=32, heads=32, kv_heads=8, head_dim=128, max_context=8192,
                              source=f"{HF}/meta-llama/Meta-Llama-3-8B/blob/main/config.json"),
    # num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8, hidden_size 8192 (head_dim 128),
    # max_position_embeddings 8192
    "llama-3-70b": ModelConfig("Llama-3-70B", layers=80, heads=64, kv_heads=8, head_dim=128, max_context=8192,
                               source=f"{HF}/meta-llama/Meta-Llama-3-70B/blob/main/config.json"),
    # num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128),
    # max_position_embeddings 32768, sliding_window 4096 on every layer
    "mistral-7b": ModelConfig("Mistral-7B-v0.1", layers=32, heads=32, kv_heads=8, head_dim=128, max_context=32768,
                              source=f"{HF}/mistralai/Mistral-7B-v0.1/blob/main/config.json", sliding_window=4096,
                              layer_types=uniform(32, LOCAL)),
    # num_hidden_layers 42, num_attention_heads 16, num_key_value_heads 8, head_dim 256, max_position_embeddings
    # 8192, sliding_window 4096, model_type gemma2: local and global layers alternate
    "gemma-2-9b": ModelConfig("Gemma-2-9B", layers=42, heads=16, kv_heads=8, head_dim=256, max_context=8192,
                              source=f"{HF}/google/gemma-2-9b/blob/main/config.json", sliding_window=4096,
                              layer_types=alternating(42)),
    # num_hidden_layers 28, num_attention_heads 28, num_key_value_heads 4, hidden_size 3584 (head_dim 128),
    # max_position_embeddings 131072; sliding_window 131072 but use_sliding_window false: every layer global
    "qwen2.5-7b": ModelConfig("Qwen2.5-7B", layers=28, heads=28, kv_heads=4, head_dim=128, max_context=131072,
                              source=f"{HF}/Qwen/Qwen2.5-7B/blob/main/config.json"),
    # Qwen3 (model_type qwen3, qwen3_moe): head_dim 128 stated (64 heads × 128 exceeds the 32B's hidden_size 5120),
    # max_position_embeddings 40960, sliding_window null and use_sliding_window false: every layer global. 8B:
    # 36 layers, 32 heads, 8 K/V heads; 32B: 64, 64, 8; 235B-A22B (the April 2025 release; its -2507 variants state
    # max_position_embeddings 262144): 94, 64, 4
    "qwen3-8b": ModelConfig("Qwen3-8B", layers=36, heads=32, kv_heads=8, head_dim=128, max_context=40960,
                            source=f"{HF}/Qwen/Qwen3-8B/blob/main/config.json"),
    "qwen3-32b": ModelConfig("Qwen3-32B", layers=64, heads=64, kv_heads=8, head_dim=128, max_context=40960,
                             source=f"{HF}/Qwen/Qwen3-32B/blob/main/config.json"),
    "qwen3-235b-a22b": ModelConfig("Qwen3-235B-A22B", layers=94, heads=64, kv_heads=4, head_dim=128, max_context=40960,
                                   source=f"{HF}/Qwen/Qwen3-235B-A22B/blob/main/config.json"),
    # num_hidden_layers 126, num_attention_heads 128, num_key_value_heads 8, hidden_size 16384 (head_dim 128),
    # max_position_embeddings 131072
    "llama-3.1-405b": ModelConfig("Llama-3.1-405B", layers=126, heads=128, kv_heads=8, head_dim=128,
                                  max_context=131072, source=f"{HF}/meta-llama/Llama-3.1-405B/blob/main/config.json"),
    # text_config: num_hidden_layers 62, num_attention_heads 32, num_key_value_heads 16, head_dim 128, sliding_window
    # 1024; no sliding_window_pattern nor max_position_embeddings stated: transformers' Gemma3TextConfig defaults, 6
    # (every sixth layer global: 52 local, 10 global) and 131072
    "gemma-3-27b": ModelConfig("Gemma-3-27B", layers=62, heads=32, kv_heads=16, head_dim=128, max_context=131072,
                               source=f"{HF}/google/gemma-3-27b-it/blob/main/config.json (text_config)",
                               sliding_window=1024, layer_types=pattern_layers(6, 62)),
    # gpt-oss (model_type gpt_oss): num_attention_heads 64, num_key_value_heads 8, head_dim 64, sliding_window 128,
    # max_position_embeddings 131072, layer_types local and global alternating, local first; 20b: 24 layers, 120b:
    # 36 (transformers' GptOssConfig, whose defaults are the 120b's; NVIDIA Megatron Bridge's gpt-oss page for the
    # 20b). Its attention has learned sinks (self_attn.sinks, one logit a head)
    "gpt-oss-20b": ModelConfig("gpt-oss-20b", layers=24, heads=64, kv_heads=8, head_dim=64, max_context=131072,
                               source=f"{HF}/openai/gpt-oss-20b/blob/main/config.json", sliding_window=128,
                               layer_types=alternating(24), sinks=True),
    "gpt-oss-120b": ModelConfig("gpt-oss-120b", layers=36, heads=64, kv_heads=8, head_dim=64, max_context=131072,
                                source=f"{HF}/openai/gpt-oss-120b/blob/main/config.json", sliding_window=128,
                                layer_types=alternating(36), sinks=True),
    # multi-head latent attention (model_type deepseek_v3; Kimi-K2 reuses its architecture, DeepseekV3ForCausalLM):
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64 (a head of Q and K: 192), v_head_dim 128, every
    # layer global; only attention is counted, the dense and MoE MLPs alike. DeepSeek-V3: num_hidden_layers 61,
    # num_attention_heads 128, num_key_value_heads 128, max_position_embeddings 163840. Kimi-K2 (the July 2025
    # Instruct release; -0905 states 262144 positions): 61 layers, 64 heads, 64 K/V heads, max_position_embeddings
    # 131072
    "deepseek-v3": ModelConfig("DeepSeek-V3", layers=61, heads=128, kv_heads=128, head_dim=192, max_context=163840,
                               source=f"{HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json", v_head_dim=128,
                               kv_lora_rank=512, qk_rope_head_dim=64),
    "kimi-k2": ModelConfig("Kimi-K2-Instruct", layers=61, heads=64, kv_heads=64, head_dim=192, max_context=131072,
                           source=f"{HF}/moonshotai/Kimi-K2-Instruct/blob/main/config.json", v_head_dim=128,
                           kv_lora_rank=512, qk_rope_head_dim=64),
}

# GPT-2's names of the common fields (transformers' GPT2Config.attribute_map; BLOOM's and GPT-J's are the same),
# and the older Falcon configs' n_head_kv (FalconConfig.attribute_map)
ALIASES = {"num_attention_heads": "n_head", "num_hidden_layers": "n_layer", "hidden_size": "n_embd",
           "max_position_embeddings": "n_positions", "attention_dropout": "attn_pdrop", "num_kv_heads": "n_head_kv"}


def get_model(name: str) -> ModelConfig:
    if not isinstance(name, str) or name not in PRESETS:
        raise InputError(f"model={name!r} is not one of {sorted(PRESETS)}; or give a config file")
    return PRESETS[name]


def load_config(path: str | Path) -> ModelConfig:
    """A Hugging Face-style config.json as a model (the module docstring lists the fields read)."""
    if not isinstance(path, (str, PathLike)):
        raise InputError(f"config={path!r} must be a path to a config.json (a str or a path), not a "
                         f"{type(path).__name__}")
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as err:
        raise InputError(f"config={str(path)!r} cannot be read: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"config={str(path)!r} is not JSON: {err}") from None
    return from_hf_config(data, source=str(path), name=p.stem)


def from_hf_config(config: dict, *, source: str, name: str = "config") -> ModelConfig:
    """A model from a Hugging Face config dict; ``source`` says where it came from."""
    if not isinstance(config, dict):
        raise InputError(f"config {source!r} is a JSON {type(config).__name__}; a config.json holds an object")
    outer = config
    text = config.get("text_config")
    if isinstance(text, dict) and _field(config, "num_attention_heads")[1] is _MISSING:
        config = text  # a multimodal config (Llama 4): the language model's attention is in text_config
    _refuse_unmodelled(config)
    heads = _count(config, "num_attention_heads")
    layers = _count(config, "num_hidden_layers")
    if layers > MAX_LAYERS:
        raise InputError(f"num_hidden_layers={layers:,} is outside the allowed range [1, {MAX_LAYERS:,}]")
    kv_heads = _kv_heads(config, heads)
    latent = _latent(config)
    if latent:
        head_dim = latent["head_dim"]
    elif config.get("head_dim") is not None:
        head_dim = _count(config, "head_dim")
    else:
        hidden = _count(config, "hidden_size")
        if hidden % heads:
            raise InputError(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}, and there is "
                             f"no head_dim field")
        head_dim = hidden // heads
    window = _count(config, "sliding_window", default=None)
    chunk = _count(config, "attention_chunk_size", default=None)
    types = _layer_types(config, layers, window, chunk)
    return ModelConfig(str(outer.get("_name_or_path") or config.get("_name_or_path") or name), layers=layers,
                       heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       max_context=_count(config, "max_position_embeddings", default=None), source=source,
                       sliding_window=window if LOCAL in types else None, layer_types=types,
                       dropout_p=_fraction(config, "attention_dropout"),
                       attention_chunk=chunk if CHUNKED in types else None,
                       sinks=config.get("model_type") in SINK_TYPES,
                       v_head_dim=latent.get("v_head_dim", _count(config, "v_head_dim", default=None)),
                       kv_lora_rank=latent.get("kv_lora_rank"), qk_rope_head_dim=latent.get("qk_rope_head_dim"))


MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _latent(config: dict) -> dict:
    """Multi-head latent attention's sizes, read together (the module docstring says which), or {} without it."""
    if config.get("kv_lora_rank") is None:
        stray = [f for f in ("qk_nope_head_dim", "qk_rope_head_dim") if config.get(f) is not None]
        if stray:
            raise InputError(f"{stray[0]}={config[stray[0]]!r} without kv_lora_rank: the split of a head into a RoPE "
                             f"and a non-RoPE part is multi-head latent attention's; give kv_lora_rank too, or neither")
        return {}
    sizes = {f: _count(config, f, least=0 if f == "qk_rope_head_dim" else 1) for f in MLA_FIELDS}  # 0: no RoPE key
    head_dim = sizes.pop("qk_nope_head_dim") + sizes["qk_rope_head_dim"]
    stated = config.get("head_dim")
    if stated is not None and stated not in (head_dim, sizes["qk_rope_head_dim"]):
        raise InputError(f"head_dim={stated!r} contradicts qk_nope_head_dim + qk_rope_head_dim = {head_dim}; allowed: "
                         f"{head_dim}, or qk_rope_head_dim={sizes['qk_rope_head_dim']} (transformers' "
                         f"DeepseekV3Config)")
    return {**sizes, "head_dim": head_dim}


# Fields that shape attention in a way iosim does not model: refused by name rather than counted wrong
UNMODELLED = {
    "attention_types": "GPT-Neo's per-layer local/global attention pattern",
    "cross_attention_layers": "cross-attention layers",
}
FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")
MAX_LAYERS = 100_000  # a config's layers are listed one by one (layer_types): far beyond any model, never a MemoryError


def _refuse_unmodelled(config: dict) -> None:
    for field, what in UNMODELLED.items():
        if config.get(field) is not None:
            raise InputError(f"{field}={config[field]!r}: {what}, which iosim does not count; no preset or config of "
                             f"it is read")
    if config.get("is_encoder_decoder") is True:
        raise InputError("is_encoder_decoder=true: iosim counts a decoder's causal self-attention, not an "
                         "encoder-decoder's")


def _flag(config: dict, name: str, default: bool) -> bool:
    value = config.get(name, default)
    if not isinstance(value, bool):
        raise InputError(f"{name}={value!r} must be true or false")
    return value


def _kv_heads(config: dict, heads: int) -> int:
    """K/V heads: num_key_value_heads; else Falcon's (and GPT-BigCode's) fields, as transformers reads them.

    FalconAttention keeps num_kv_heads (n_head_kv) K/V heads when new_decoder_architecture is true or multi_query
    false, and one otherwise; FalconConfig defaults multi_query to true. GPT-BigCode's multi_query: true is one too.
    """
    if config.get("num_key_value_heads") is not None:
        return _count(config, "num_key_value_heads")
    multi_query = _flag(config, "multi_query", config.get("model_type") in FALCON_TYPES)
    new_architecture = _flag(config, "new_decoder_architecture", False)
    if multi_query and not new_architecture:
        return 1
    return _count(config, "num_kv_heads", default=heads)


def _layer_types(config: dict, layers: int, window: int | None, chunk: int | None) -> tuple[str, ...]:
    """Which layers are local or chunked, by the rules of the module docstring, in that order."""
    if "layer_types" in config:
        types = config["layer_types"]
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise InputError(f"layer_types={types!r} must be a list of strings, one a layer")
        if LOCAL in types and window is None:
            raise InputError("layer_types names sliding_attention layers but sliding_window is missing or null")
        if CHUNKED in types and chunk is None:
            raise InputError("layer_types names chunked_attention layers but attention_chunk_size is missing or null")
        return tuple(types)
    if chunk is not None:
        return _chunked_layers(config, layers)
    if window is None:
        return uniform(layers)
    if "sliding_window_pattern" in config:
        return pattern_layers(_count(config, "sliding_window_pattern"), layers)
    if config.get("model_type") in GEMMA3:  # its published configs state no pattern: Gemma3TextConfig's default
        return pattern_layers(GEMMA3_PATTERN, layers)
    if config.get("model_type") == "gemma2":
        return alternating(layers)
    use = config.get("use_sliding_window", True)
    if not isinstance(use, bool):
        raise InputError(f"use_sliding_window={use!r} must be true or false")
    if not use:
        return uniform(layers)
    first = _count(config, "max_window_layers", default=0, least=0)
    return tuple(LOCAL if i >= first else GLOBAL for i in range(layers))


def _chunked_layers(config: dict, layers: int) -> tuple[str, ...]:
    """Llama 4: the layers that use RoPE attend within their chunk, the NoPE ones globally (transformers'
    Llama4TextConfig: no_rope_layers, 1 for a RoPE layer, default every layer but each no_rope_layer_interval-th)."""
    flags = config.get("no_rope_layers")
    if not flags:  # absent, null or [] (transformers: ``no_rope_layers if no_rope_layers else`` the default)
        interval = _count(config, "no_rope_layer_interval", default=4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) < layers or not all(f in (0, 1) for f in flags):
        raise InputError(f"no_rope_layers={flags!r} must be a list of 0 and 1, one a layer ({layers})")
    return tuple(CHUNKED if flags[i] else GLOBAL for i in range(layers))


def _field(config: dict, name: str):
    """The value of ``name``, or of GPT-2's alias for it; absent is missing."""
    alias = ALIASES.get(name)
    if name not in config and alias in config:
        return alias, config[alias]
    return name, config.get(name, _MISSING)


_MISSING = object()


def _count(config: dict, name: str, default=_MISSING, least: int = 1):
    """A whole number >= ``least`` from ``config``, or ``default`` when absent or null (a required field has
    none)."""
    shown, value = _field(config, name)
    if value is _MISSING or value is None:
        if default is _MISSING:
            alias = f" (or {ALIASES[name]})" if name in ALIASES else ""
            raise InputError(f"{name}{alias} is missing from the config; it is required")
        return default
    return _check_count(shown, value, least)


def _fraction(config: dict, name: str) -> float:
    shown, value = _field(config, name)
    if value is _MISSING or value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InputError(f"{shown}={value!r} must be a probability in [0, 1)")
    return float(value)

