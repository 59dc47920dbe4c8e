"""A whole model's attention: HBM bytes, FLOPs and roofline time per layer and for every layer, in three phases.

For a model (``iosim.models.presets``), a batch, a GPU preset and a sequence length N, every
algorithm of the registry is counted (``iosim.count``, checked against
``iosim.predict``) in:

- a **training step**: forward and backward (``pass_="fwd+bwd"``) at N_q = N_k = N;
- **prefill**: the forward pass at N_q = N_k = N;
- **decoding**: one new token against a context of C keys, N_q = 1, N_k = C;

all causal. Each distinct kind of layer (global, or local with a sliding window) is
counted once and multiplied by its number of layers, so a model costs a few counts, each
O(1) in N. The time is the preset's roofline (``iosim.core.gpus.roofline``, the sweep's) from
the L2 model's DRAM bytes (``iosim.gpu``) where it covers the layer (a forward pass of an algorithm with a kernel),
else from the two-level HBM bytes, each layer saying which (``LayerCost.time_from``), and layers run one after
another, so times add.
An algorithm that refuses a phase (no backward pass, a shape it does not take) is listed
with the reason. Attention only: no MLP, no KV-cache capacity.

Deviations from the model as it runs:
- Grouped-query attention in a training step is counted with K/V expanded to every query
  head: iosim's backward passes take no K/V groups. Transformers' eager and SDPA paths
  expand K and V so (``repeat_kv``); FlashAttention-2's GQA backward reads the same K/V
  bytes and writes dK, dV per query head, then sums them over the group, which is not
  counted.
- A local layer whose keys all fit its window (N_k <= W) is counted as the causal
  attention it then equals; one whose window clips passes ``window=(W - 1, 0)``
  (flash-attn's convention for Hugging Face's W) to ``iosim.count``.
- A chunked layer (Llama 4's attention_chunk_size C) is counted as its chunks: packed documents of C tokens in a
  prefill or training step (``layer_lengths``), the new token's chunk in decoding.
- Multi-head latent attention (DeepSeek-V3, Kimi-K2) is counted as its kernels run it (``layer_heads``): a training
  step and prefill with the heads expanded (d = qk_nope_head_dim + qk_rope_head_dim for Q and K, d_v = v_head_dim),
  decoding with the projections absorbed, every query head against one latent K of kv_lora_rank + qk_rope_head_dim
  a token whose first kv_lora_rank columns are V (``Problem.latent``, as FlashMLA reads it). The projections between
  the latent and the heads are matrix products outside attention, not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from iosim.api import closed_form, count_problem, measure, plan
from iosim.core.counts import Counts
from iosim.core.errors import InputError
from iosim.core.flops import Flops
from iosim.core.gpus import DEFAULT, Roofline, get_gpu, resolve_M, roofline
from iosim.core.inputs import name_list
from iosim.core.tiling import Tiling
from iosim.core.units import FP8_DTYPES, check_dtype, parse_count
from iosim.gpu.dram import covered_dram_or_why
from iosim.gpu.hardware import Hardware, hardware
from iosim.gpu.kernels import no_build
from iosim.gpu.l2 import DramCounts
from iosim.models.config import LayerKind, ModelConfig
from iosim.models.presets import get_model
from iosim.registry import ALGORITHMS

PHASES = ("training", "prefill", "decode")
ATTENTION_ONLY = "attention only: no MLP, no KV-cache capacity"


@dataclass(frozen=True)
class Phase:
    """What one phase runs in every layer: the pass and the query and key lengths."""

    name: str  # one of PHASES
    pass_: str  # "fwd+bwd" or "fwd"
    n_q: int
    n_k: int

    @property
    def title(self) -> str:
        return {"training": f"training step (forward + backward), N = {self.n_q:,}",
                "prefill": f"prefill (forward), N = {self.n_q:,}",
                "decode": f"decoding one token, context {self.n_k:,} (N_q = 1)"}[self.name]


@dataclass(frozen=True)
class LayerCost:
    """One algorithm on one layer of a kind: its counts over the batch and every head."""

    kind: LayerKind
    kv_heads: int  # as counted (every query head's in a training step; see the module docstring)
    d: int  # Q's and K's head size as counted: head_dim, or MLA's latent in decoding
    d_v: int  # V's, as counted
    latent: bool  # counted from MLA's latent cache (decoding with the projections absorbed)
    window: tuple[int, int] | None  # the window= passed to iosim.count; None when the layer is counted as causal
    forward_tiling: Tiling | None
    backward_tiling: Tiling | None
    counts: Counts  # one layer, measured count-only
    exact: bool  # the count equals the closed form (iosim.predict)
    flops: Flops
    roofline: Roofline  # from the DRAM bytes where the L2 model covers the layer, else from the HBM bytes
    dram: DramCounts | None = None  # the L2 model's bytes of a forward pass its kernels cover (iosim.gpu); else None
    dram_note: str | None = None  # why a layer the L2 model covers has none (too slow, or not timed)

    @property
    def time_from(self) -> str:
        """What the roofline time was computed from: "DRAM" (the L2 model's bytes) or "HBM" (the two-level count)."""
        return "HBM" if self.dram is None else "DRAM"


@dataclass(frozen=True)
class AlgorithmCost:
    """One algorithm in one phase: a cost per kind of layer, or the reason it does not run."""

    algorithm: str
    layers: tuple[LayerCost, ...]  # one per kind of layer; () when skipped
    skipped: str | None = None

    @property
    def total_bytes(self) -> int | None:
        """HBM bytes of every layer of the model."""
        return None if self.skipped else sum(c.counts.total_bytes * c.kind.layers for c in self.layers)

    @property
    def flops(self) -> Flops | None:
        return None if self.skipped else sum((c.flops.scaled(c.kind.layers) for c in self.layers), Flops())

    @property
    def dram_bytes(self) -> int | None:
        """The L2 model's DRAM bytes of every layer; None unless it covers every kind of layer."""
        if self.skipped or any(c.dram is None for c in self.layers):
            return None
        return sum(c.dram.moved * c.kind.layers for c in self.layers)

    @property
    def seconds(self) -> float | None:
        """Roofline time of every layer, one after another."""
        return None if self.skipped else sum(c.roofline.seconds * c.kind.layers for c in self.layers)


@dataclass(frozen=True)
class PhaseCost:
    phase: Phase
    algorithms: tuple[AlgorithmCost, ...]

    @property
    def ran(self) -> tuple[AlgorithmCost, ...]:
        return tuple(a for a in self.algorithms if a.skipped is None)

    @property
    def least(self) -> AlgorithmCost | None:
        """The algorithm that moves the fewest HBM bytes over the model; None when none ran."""
        return min(self.ran, key=lambda a: a.total_bytes, default=None)

    def ratio(self, a: AlgorithmCost) -> float | None:
        """``a``'s bytes over the least's."""
        least = self.least
        return None if a.skipped or least is None else a.total_bytes / least.total_bytes


@dataclass(frozen=True)
class ModelReport:
    model: ModelConfig
    batch: int
    gpu: str  # the preset's name
    dtype: str
    M: int  # SRAM capacity, elements
    phases: tuple[PhaseCost, ...]
    notes: tuple[str, ...]  # what the numbers leave out or assume


def model(name: str | ModelConfig, *, N=None, context=None, batch=1, gpu: str = DEFAULT, dtype="float16", M=None,
          algorithms: Iterable[str] | None = None, phases: Iterable[str] = PHASES,
          on_step: Callable[[AlgorithmCost], None] | None = None,
          on_phase: Callable[[ModelReport], None] | None = None) -> ModelReport:
    """Count a model's attention in each phase, at each N (an int or a list; default its max context) and decode
    context (default: each N). ``name`` is a preset (``iosim.models.presets.PRESETS``) or a ``ModelConfig``
    (``iosim.models.hf_config.load_config`` reads a Hugging Face config.json). M defaults to the preset's shared memory
    per SM; ``algorithms`` to every registered one that needs no block mask. ``on_step`` sees each
    (phase, algorithm) as it is done, ``on_phase`` the report of the phases done so far as each ends (what a run
    that may be cut keeps)."""
    cfg = name if isinstance(name, ModelConfig) else get_model(name)
    for what, f, arg in (("on_step", on_step, "each AlgorithmCost"), ("on_phase", on_phase, "each ModelReport")):
        if f is not None and not callable(f):
            raise InputError(f"{what}={f!r} is not callable; allowed: a function of {arg}, or None")
    check_dtype(dtype)
    preset = get_gpu(gpu)
    preset.peak(dtype)  # a dtype without a peak FLOP/s on this GPU is refused before anything runs
    M = resolve_M(M, gpu, dtype)
    batch = parse_count("batch", batch)
    names = check_algorithms(algorithms)
    plan = plan_phases(cfg, N, context, phases)
    hw = hardware(preset)  # the DRAM level's GPU, resolved once
    notes = report_notes(cfg, names, plan, dtype, algorithms is None)
    report = ModelReport(cfg, batch, preset.name, dtype, M, (), notes)
    for phase in plan:
        costs = []
        for a in names:
            cost = algorithm_cost(a, cfg, phase, batch=batch, M=M, gpu=gpu, dtype=dtype, hw=hw)
            costs.append(cost)
            if on_step is not None:
                on_step(cost)
        report = replace(report, phases=report.phases + (PhaseCost(phase, tuple(costs)),))
        if on_phase is not None:
            on_phase(report)
    return report


def default_algorithms() -> list[str]:
    """Every registered algorithm that needs nothing a model lacks (the block-sparse ones need a block mask)."""
    return [name for name, a in ALGORITHMS.items() if a.listed_by_default(())]


def check_algorithms(algorithms: Iterable[str] | None) -> list[str]:
    """The algorithms named, each registered, or by default ``default_algorithms()``."""
    return default_algorithms() if algorithms is None else name_list("algorithms", algorithms, ALGORITHMS)


def plan_phases(cfg: ModelConfig, N=None, context=None, phases: Iterable[str] = PHASES) -> list[Phase]:
    """The phases a report counts, in order: training and prefill at each N (default: the model's max context),
    then decoding at each context (default: each N)."""
    if N is None and cfg.max_context is None:
        raise InputError(f"N=None: {cfg.name} states no max_position_embeddings to default to; give N (--N)")
    Ns = _lengths("N", cfg.max_context if N is None else N)
    contexts = Ns if context is None else _lengths("context", context)
    chosen = name_list("phases", phases, PHASES)
    if context is not None and "decode" not in chosen:
        raise InputError(f"context={context!r} with phases={chosen}: only decoding reads a context; allowed: phases "
                         f"with 'decode', or context=None")
    return [Phase(p, "fwd+bwd" if p == "training" else "fwd", n, n) for n in Ns for p in ("training", "prefill")
            if p in chosen] + [Phase("decode", "fwd", 1, c) for c in contexts if "decode" in chosen]


def algorithm_cost(algorithm: str, cfg: ModelConfig, phase: Phase, *, batch: int, M: int, gpu: str,
                   dtype: str, hw: Hardware) -> AlgorithmCost:
    """Every kind of layer of ``cfg`` counted for one algorithm, or the first refusal (an InputError) as its
    reason."""
    try:
        layers = tuple(layer_cost(algorithm, cfg, kind, phase, batch=batch, M=M, gpu=gpu, dtype=dtype, hw=hw)
                       for kind in cfg.kinds())
    except InputError as err:
        return AlgorithmCost(algorithm, (), str(err))
    return AlgorithmCost(algorithm, layers)


def layer_cost(algorithm: str, cfg: ModelConfig, kind: LayerKind, phase: Phase, *, batch: int, M: int, gpu: str,
               dtype: str, hw: Hardware) -> LayerCost:
    """One layer of ``kind``: counted, checked against its closed form, and timed on the preset (``hw``: its DRAM
    level)."""
    training = phase.pass_ != "fwd"
    kv_heads, d, d_v, latent = layer_heads(cfg, phase)
    window = layer_window(kind, phase.n_k)
    n_q, n_k, batch, seqlens = layer_lengths(kind, phase, batch)
    # the sinks where the passes take them (report_notes says where they are left out)
    sinks = cfg.sinks and seqlens is None and ALGORITHMS[algorithm].takes_sinks(phase.pass_)
    pb = count_problem(n_q, d, n_k, batch, cfg.heads, causal=True, seqlens=seqlens,
                       dropout_p=cfg.dropout_p if training else 0.0, dtype=dtype, kv_heads=kv_heads, window=window,
                       sinks=sinks, d_v=d_v, latent=latent)
    request = plan(algorithm, pb, M, pass_=phase.pass_, gpu=gpu)  # planned once: the count and the closed form
    measured, exact = measure(request, gpu), closed_form(request)
    # the L2 model covers forward passes of the algorithms with kernels (iosim.gpu); no kernel it describes reads
    # sinks, so a layer with them takes the DRAM bytes of the same layer without (report_notes says so)
    dram, note = None, None
    if not training:
        plans = measured.plans if not sinks else plan(algorithm, replace(pb, sinks=False), M, gpu=gpu).plans
        dram, _, note = covered_dram_or_why(plans, hw, algorithm)
    moved = measured.traffic.total_bytes if dram is None else dram.moved
    return LayerCost(kind, kv_heads, d, d_v, latent, window, measured.forward_tiling, measured.backward_tiling,
                     measured.traffic, measured.traffic == exact.exact, measured.flops,
                     roofline(hw.gpu, dtype, moved, measured.flops), dram, note)


def layer_heads(cfg: ModelConfig, phase: Phase) -> tuple[int, int, int, bool]:
    """(kv_heads, d, d_v, latent) to count a layer of ``cfg`` in ``phase`` with: a training step with K/V for every
    query head (the module docstring says why), MLA's decoding on its latent cache (one K/V head, ``latent_heads``),
    everything else as the config states it."""
    if phase.pass_ != "fwd":
        return cfg.heads, cfg.head_dim, cfg.d_v, False
    if cfg.mla and phase.name == "decode":
        return (1, *cfg.latent_heads(), True)
    return cfg.kv_heads, cfg.head_dim, cfg.d_v, False


def layer_lengths(kind: LayerKind, phase: Phase, batch: int) -> tuple[int | None, int | None, int, list | None]:
    """(N_q, N_k, batch, seqlens) to count a layer of ``kind`` in ``phase`` with.

    A chunked layer (Llama 4) lets a query see the earlier keys of its own C-token chunk: a prefill or training step
    longer than C is its chunks as packed documents, each causal (``seqlens``: every sequence of the batch cut into
    chunks), and decoding at a context of c keys sees the (c − 1) mod C + 1 keys of the new token's chunk.
    """
    C = kind.chunk
    if C is None or phase.n_k <= C:
        return phase.n_q, phase.n_k, batch, None
    if phase.n_q == 1:
        return 1, (phase.n_k - 1) % C + 1, batch, None
    full, rest = divmod(phase.n_q, C)
    return None, None, 1, ([C] * full + ([rest] if rest else [])) * batch


def layer_window(kind: LayerKind, n_k: int) -> tuple[int, int] | None:
    """flash-attn's ``window_size`` for a layer of ``kind`` at N_k keys; None where the window hides no key.

    Hugging Face's sliding window W lets query i see keys i − W < j <= i: W keys, itself
    included, which is flash-attn's (W − 1, 0). With the causal diagonal at the bottom
    right, the window clips only when N_k > W.
    """
    if kind.window is None or n_k <= kind.window:
        return None
    return kind.window - 1, 0


def report_notes(cfg: ModelConfig, algorithms: list[str], plan: list[Phase], dtype: str, default: bool = True
                 ) -> tuple[str, ...]:
    """What the report leaves out or assumes; ``default``: ``algorithms`` are the default ones, not those asked for."""
    notes = [ATTENTION_ONLY + "; roofline times from the L2 model's DRAM bytes where it covers a layer (a forward "
                              "pass of an algorithm with a kernel: prefill and decoding), else from the two-level HBM "
                              "bytes (training), summed over the layers"]
    masked = [a for a in ALGORITHMS if not ALGORITHMS[a].listed_by_default(())]
    if default:
        notes.append(f"{', '.join(masked)}: not counted, they need a block mask and a model's attention has none")
    elif set(masked) & set(algorithms):
        notes.append(f"{', '.join(a for a in algorithms if a in masked)}: counted without a block mask, which a "
                     f"model's attention has none of: dense")
    if cfg.grouped and any(p.name == "training" for p in plan):
        notes.append(f"training: K/V counted for all {cfg.heads} query heads (iosim's backward passes take no K/V "
                     f"groups; as transformers' repeat_kv expands them); the group sum of dK, dV is not counted")
    if cfg.dropout_p and any(p.name == "training" for p in plan):
        notes.append(f"training: attention dropout {cfg.dropout_p:g}, as the config sets; none in prefill and decoding")
    if cfg.sliding_window is not None:
        notes.append(f"local layers: a query sees the last {cfg.sliding_window:,} keys, itself included (Hugging "
                     f"Face's sliding_window; flash-attn's window ({cfg.sliding_window - 1}, 0)); where N_k <= "
                     f"{cfg.sliding_window:,} that is causal attention")
    if "split-kv" in algorithms and any(p.n_q > 1 for p in plan):
        notes.append("split-kv is a decoding kernel: it skips the key blocks a causal mask hides only inside a "
                     "sliding window (iosim.algorithms.split_kv), so on global layers its prefill reads every key "
                     "block, where the FlashAttention family skips the hidden half")
    lacking = no_build(algorithms, dtype, suggest=False)  # the model command takes no --kernel
    if lacking is not None and any(p.name != "training" for p in plan):
        notes.append(lacking)
    if dtype in FP8_DTYPES:
        notes.append(f"{dtype}: Q, K and V one byte an element, with three float32 descales per K/V head that every "
                     f"thread block reads, O returned in bfloat16, as FlashAttention-3's FP8 forward; only the "
                     f"algorithms with an FP8 forward are counted, and no training step (its kernels have no FP8 "
                     f"backward)")
    if cfg.mla:
        d, d_v = cfg.latent_heads()
        notes.append(f"multi-head latent attention: training and prefill counted with the heads expanded (d = "
                     f"{cfg.head_dim}, d_v = {cfg.d_v}, {cfg.kv_heads} K/V heads), decoding on the latent cache with "
                     f"the projections absorbed (every query head against one latent of d = {d}, V its first d_v = "
                     f"{d_v} columns, as FlashMLA reads it; only algorithms that read it count decoding); the "
                     f"projections are not counted, and the L2 model describes no kernel of either, so times are from "
                     f"HBM bytes")
    if cfg.attention_chunk is not None:
        notes.append(f"chunked layers: a query sees the earlier keys of its own {cfg.attention_chunk:,}-token chunk "
                     f"(attention_chunk_size); prefill and training count the chunks as packed documents, decoding "
                     f"the keys of the new token's chunk")
    longest = max(max(p.n_q, p.n_k) for p in plan) if plan else 0
    if cfg.max_context is not None and longest > cfg.max_context:
        notes.append(f"{longest:,} keys is beyond the {cfg.max_context:,} of max_position_embeddings")
    if cfg.sinks:
        passes = {p.pass_ for p in plan}
        taking = [f"{'prefill and decoding' if p == 'fwd' else 'training'}: "
                  f"{', '.join(a for a in algorithms if ALGORITHMS[a].takes_sinks(p)) or 'none'}"
                  for p in ("fwd", "fwd+bwd") if p in passes]
        notes.append(f"learned attention sinks (one logit a query head) are counted where the passes take them "
                     f"({'; '.join(taking)}); the others are counted without them, and the DRAM bytes (and the "
                     f"times from them) are the layer's without its sinks, which no kernel the L2 model describes "
                     f"reads")
    return tuple(notes)


def _lengths(name: str, value) -> list[int]:
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise InputError(f"{name}=[] is empty; give at least one length")
    return [parse_count(name, v) for v in values]
