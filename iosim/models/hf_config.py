"""Hugging Face config files as models: ``load_config`` reads a ``config.json`` the user passes (nothing is
downloaded) into a ``ModelConfig``, with these fields:

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
from os import PathLike
from pathlib import Path

from iosim.core.errors import InputError
from iosim.models.config import (
    CHUNKED,
    GLOBAL,
    LOCAL,
    ModelConfig,
    alternating,
    check_count,
    pattern_layers,
    uniform,
)

GEMMA3, GEMMA3_PATTERN = ("gemma3", "gemma3_text"), 6  # transformers' Gemma3TextConfig: sliding_window_pattern=6
# model_type of the models whose attention has learned sinks, a weight (self_attn.sinks) no config field names
SINK_TYPES = ("gpt_oss",)

# GPT-2's names of the common fields (transformers' GPT2Config.attribute_map; BLOOM's and GPT-J's are the same),
# and the older Falcon configs' n_head_kv (FalconConfig.attribute_map)
ALIASES = {"num_attention_heads": "n_head", "num_hidden_layers": "n_layer", "hidden_size": "n_embd",
           "max_position_embeddings": "n_positions", "attention_dropout": "attn_pdrop", "num_kv_heads": "n_head_kv"}


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
    return check_count(shown, value, least)


def _fraction(config: dict, name: str) -> float:
    shown, value = _field(config, name)
    if value is _MISSING or value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InputError(f"{shown}={value!r} must be a probability in [0, 1)")
    return float(value)
