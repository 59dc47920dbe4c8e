"""Attention of 2025-26 models from the presets: MLA's decode bytes, and gpt-oss's banded layers against its full ones.

Two figures, every number an exact count (``iosim.model``, count-only, each layer equal to its closed form) on the
H100 preset in float16; nothing here runs on a GPU:

- ``mla_decode``: the HBM bytes one decoded token moves in one attention layer of DeepSeek-V3 against the context,
  read as FlashMLA reads it (split-kv on the latent cache: 128 query heads against one latent of 576, V its first
  512 columns), beside the same 128 heads kept as K and V (192 and 128 a head, what decoding without the absorbed
  projections reads) and the GQA of Llama-3.1-405B (128 query heads on 8 K/V heads of 128), and each one's KV cache
  a token a layer;
- ``gpt_oss_layers``: gpt-oss-120b's two kinds of layer, a 128-token banded window with learned sinks and full
  causal attention, in prefill (flash-swapped) and in decoding (split-kv), against the context;
- ``fp8_decode``: Llama-3-70B's decoding (split-kv) and prefill (flash-swapped) in float16 and in FP8 (e4m3, as
  FlashAttention-3's FP8 forward: one byte an element, descales, O in bfloat16), one layer, against the context.

Usage: python -m experiments.modern_attention [--figures docs/figures]
           [--json experiments/results/modern_attention.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import iosim  # noqa: E402
from experiments.figure_cli import run  # noqa: E402
from iosim.models.presets import PRESETS  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GPU, DTYPE = "h100", "float16"
CONTEXTS = [2**k for k in range(10, 18)]  # 1Ki … 128Ki keys
DEEPSEEK = PRESETS["deepseek-v3"]
# DeepSeek-V3's 128 heads without the absorbed projections: K and V of every head (192 and 128), as prefill has them
EXPANDED = replace(DEEPSEEK, name="DeepSeek-V3, heads as K and V", kv_lora_rank=None, qk_rope_head_dim=None)
DECODE = {"MLA latent (DeepSeek-V3)": DEEPSEEK, "heads as K and V (DeepSeek-V3 expanded)": EXPANDED,
          "GQA 128/8 × 128 (Llama-3.1-405B)": PRESETS["llama-3.1-405b"]}
GPT_OSS = "gpt-oss-120b"
FP8 = {"float16": "float16", "float8_e4m3": "float8_e4m3"}
LLAMA = "llama-3-70b"


def layer_bytes(cfg, phase: str, n: int, algorithm: str, dtype: str = DTYPE) -> dict[str, int]:
    """HBM bytes of one layer of each kind of ``cfg`` in ``phase`` at ``n`` tokens (decoding: context n)."""
    report = iosim.model(cfg, N=n, phases=[phase], algorithms=[algorithm], gpu=GPU, dtype=dtype)
    (cost,) = report.phases[0].ran
    if not all(layer.exact for layer in cost.layers):
        raise RuntimeError(f"{cfg.name} {phase} N={n}: a count differs from its closed form")
    return {layer.kind.label: layer.counts.total_bytes for layer in cost.layers}


def collect() -> dict:
    decode = [dict(model=label, context=c, bytes=layer_bytes(cfg, "decode", c, "split-kv")["global"],
                   kv_cache_bytes_per_token_layer=cfg.kv_cache_bytes(DTYPE)["per_layer"])
              for label, cfg in DECODE.items() for c in CONTEXTS]
    banded = [dict(phase=phase, algorithm=algorithm, N=n, **layer_bytes(GPT_OSS, phase, n, algorithm))
              for phase, algorithm in (("prefill", "flash-swapped"), ("decode", "split-kv")) for n in CONTEXTS]
    fp8 = [dict(phase=phase, algorithm=algorithm, dtype=dtype, N=n,
                bytes=layer_bytes(LLAMA, phase, n, algorithm, dtype)["global"])
           for phase, algorithm in (("prefill", "flash-swapped"), ("decode", "split-kv")) for dtype in FP8
           for n in CONTEXTS[:6]]
    return dict(gpu=GPU, dtype=DTYPE, contexts=CONTEXTS, mla_decode=decode, gpt_oss=banded, fp8=fp8)


def plot(data: dict) -> dict[str, Figure]:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label in DECODE:
        rows = [r for r in data["mla_decode"] if r["model"] == label]
        cache = rows[0]["kv_cache_bytes_per_token_layer"]
        ax.plot([r["context"] for r in rows], [r["bytes"] / 1e6 for r in rows], "o-",
                label=f"{label}: KV cache {cache / 1e3:.2f} KB a token")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (keys)")
    ax.set_ylabel("HBM MB, one decoded token, one layer")
    ax.set_title("Decoding one token, split-kv on the H100 preset, float16", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig2 = phase_panels(lambda phase: [
        (f"{kind} layer", style, [r for r in data["gpt_oss"] if r["phase"] == phase], kind)
        for kind, style in (("global", "o-"), ("local 128", "s--"))],
        "HBM MB, one layer, with its sinks", "gpt-oss-120b: banded (128) against full layers, H100 preset, float16")
    fig3 = phase_panels(lambda phase: [
        (dtype, style, [r for r in data["fp8"] if r["phase"] == phase and r["dtype"] == dtype], "bytes")
        for dtype, style in zip(FP8, ("o-", "s--"))],
        "HBM MB, one layer", "Llama-3-70B in float16 and FP8 (FlashAttention-3's FP8 forward), H100 preset")
    return {"mla_decode": fig, "gpt_oss_layers": fig2, "fp8_decode": fig3}


def phase_panels(curves, ylabel: str, title: str) -> Figure:
    """Prefill and decoding side by side against the context: ``curves(phase)`` gives each curve's (label, style,
    rows, the key of their bytes)."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0))
    for ax, phase in zip(axes, ("prefill", "decode")):
        for label, style, rows, key in curves(phase):
            ax.plot([r["N"] for r in rows], [r[key] / 1e6 for r in rows], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_title(f"{phase} ({rows[0]['algorithm']})", fontsize=10)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    data = run(__doc__, "modern_attention", collect, plot, argv, dpi=120)
    for r in data["mla_decode"]:
        print(f"{r['model']:42} context {r['context']:>7,}  {r['bytes'] / 1e6:10.2f} MB")
    for r in data["fp8"]:
        print(f"Llama-3-70B {r['phase']:8} {r['dtype']:12} N {r['N']:>7,}  {r['bytes'] / 1e6:10.2f} MB")
    for r in data["gpt_oss"]:
        print(f"gpt-oss-120b {r['phase']:8} N {r['N']:>7,}  global {r['global'] / 1e6:10.2f} MB  "
              f"local {r['local 128'] / 1e6:8.2f} MB")


if __name__ == "__main__":
    main()
