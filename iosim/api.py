"""The Python API: ``simulate`` (numeric), ``count`` (count-only) and ``predict`` (closed form).

``algorithm`` is a registered name (``iosim.ALGORITHMS``) or an ``iosim.Algorithm``.
The tiling is chosen by ``block_policy`` (``iosim.tilings.policies.POLICIES``) unless an
explicit ``tiling=iosim.Tiling(Br, Bc)`` is given. ``count`` and ``predict`` take
``pass_="bwd"`` for an algorithm's backward pass (``iosim.gradients`` runs it
numerically) and ``pass_="fwd+bwd"`` for both, a training step; each pass chooses its
own tiling, except that a block-sparse algorithm runs both on the backward's.

Every entry point resolves its inputs once, with ``plan``: the algorithm looked up,
M parsed, each pass's tiling chosen, into a frozen ``Request`` of ``Plan``s that
``measure`` runs count-only and ``closed_form`` evaluates.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from iosim.algorithms.algorithm import Algorithm
from iosim.core.counts import combined
from iosim.core.errors import InputError, InputTypeError
from iosim.core.gpus import DEFAULT, get_gpu
from iosim.core.inputs import (
    check_flag,
    check_mask,
    check_positive_int,
    check_qkv,
    check_scale,
    check_sinks,
    check_values,
    listed_array,
)
from iosim.core.memory import Memory
from iosim.core.problem import AttentionShape, Problem, check_window
from iosim.core.tiling import Tiling
from iosim.core.units import parse_size
from iosim.plans import Plan, Request
from iosim.registry import ALGORITHMS, get_algorithm
from iosim.results import PredictResult, SimResult
from iosim.tilings.policies import choose_tiling
from iosim.variants.flex import check_flex_mask, gather_heads, scatter_heads
from iosim.variants.paging import check_page_size
from iosim.variants.score_mods import check_score_mod
from iosim.variants.sparsity import check_block_sparsity
from iosim.variants.varlen import check_seqlens, gather, packed, scatter

PASSES = ("fwd", "bwd", "fwd+bwd")  # the forward pass, the backward pass that reads what it saved, or both


def backward_of(algo: Algorithm) -> Algorithm:
    """The backward pass of ``algo``, or an InputError naming it when it has none."""
    if algo.backward is None:
        with_one = [a.name for a in ALGORITHMS.values() if a.backward is not None]
        raise InputError(f"algorithm={algo.name!r} has no backward pass; allowed with pass 'bwd' or 'fwd+bwd': "
                         f"{', '.join(with_one)}, or an Algorithm whose backward is set")
    return algo.backward


def check_pass(pass_) -> str:
    if pass_ not in PASSES:
        raise InputError(f"pass_={pass_!r} is not one of {list(PASSES)}")
    return pass_


def plan(algorithm, pb: Problem, M, *, pass_: str = "fwd", block_policy: str = "fit", tiling: Tiling | None = None,
         splits=None, gpu: str | None = None) -> Request:
    """Resolve a request once: the algorithm looked up, M in elements, each pass's tiling chosen.

    Each pass chooses its own tiling with ``block_policy``, except that an algorithm whose
    passes share one (``Algorithm.step_shares_tiling``) runs both on the backward's, which
    fits the forward too; an explicit ``tiling`` is used for every pass. ``splits`` sets the
    K/V splits of every pass (an algorithm that does not split takes only 1); ``gpu`` names
    the preset whose SMs an algorithm's default splits fill (``iosim.core.gpus.DEFAULT`` when
    None). A block mask on an algorithm that has none is refused, like any option that
    does not apply.
    """
    forward = get_algorithm(algorithm)
    check_pass(pass_)
    M = parse_size(M, pb.dtype)
    sms = int(get_gpu(DEFAULT if gpu is None else gpu).sms.value)
    forward.refuse_options(pb, pass_, ALGORITHMS.values())
    if pass_ != "fwd" and pb.shape.kv_heads != pb.shape.heads:
        raise InputError(f"kv_heads={pb.shape.kv_heads} with pass {pass_!r}: the backward passes take "
                         f"kv_heads == heads={pb.shape.heads} (grouped-query attention is forward only)")

    def pass_plan(algo: Algorithm, tiling_: Tiling | None, splits_) -> Plan:
        chosen = choose_tiling(algo, algo.run_problem(pb), M, block_policy, tiling_, splits_, sms)
        return Plan(algo, pb, M, chosen)

    if pass_ == "fwd":
        return Request(forward, pass_, pass_plan(forward, tiling, splits), None)
    backward = pass_plan(backward_of(forward), tiling, splits)
    if pass_ == "bwd":
        return Request(forward, pass_, None, backward)
    shared = tiling if tiling is not None else backward.tiling if forward.step_shares_tiling else None
    return Request(forward, pass_, pass_plan(forward, shared, splits), backward)


def count_problem(N, d, N_k=None, batch=1, heads=1, *, causal=False, mask=False, dropout_p=0.0, seed=0,
                  dtype="float16", block_sparsity=None, kv_heads=None, window=None, page_size=None, seqlens=None,
                  cu_seqlens=None, sinks=False, d_v=None, latent=False, block_mask=None, score_mod=None) -> Problem:
    """The problem of a count or a prediction: sizes only, no data. ``d`` is the head size of Q and K, ``d_v`` that
    of V and O (None: d); ``latent``: V is the first d_v columns of K, MLA's latent cache (``Problem.latent``).
    Packed documents (``seqlens`` or ``cu_seqlens``, iosim.variants.varlen) set N and N_k, which must then be None.
    ``sinks``: whether each query head reads a learned attention sink (``Problem.sinks``); ``block_mask``: a
    FlexAttention block mask of N and N_k (``iosim.block_mask``); ``score_mod``: its score_mod
    (``iosim.variants.score_mods.score_mod``)."""
    docs = check_seqlens(seqlens, cu_seqlens)
    if docs is not None and (N, N_k) != (None, None):
        raise InputError(f"N={N!r}, N_k={N_k!r} with seqlens: the documents set the lengths; allowed: N=None, N_k=None")
    if docs is None and N is None:
        raise InputError("N=None: give N (the query length), or seqlens / cu_seqlens (packed documents)")
    if docs is not None and block_mask is not None:
        raise InputError("seqlens with block_mask: a FlexAttention block mask expresses packed documents itself "
                         "(iosim.variants.flex.document); allowed: one of them")
    N = max(docs) if docs is not None else N
    shape = AttentionShape(
        batch=check_positive_int("batch", batch), heads=check_positive_int("heads", heads),
        n_q=check_positive_int("N", N), n_k=check_positive_int("N_k", N if N_k is None else N_k),
        d=check_positive_int("d", d), kv_heads=None if kv_heads is None else check_positive_int("kv_heads", kv_heads),
        d_v=None if d_v is None else check_positive_int("d_v", d_v),
    )
    if not isinstance(mask, (bool, np.bool_)):
        raise InputTypeError(f"mask={type(mask).__name__}: count and predict take mask=True or False (whether an "
                             f"explicit mask is read); simulate takes the boolean mask array")
    return packed(Problem(shape, tau=check_scale(None, shape.d), causal=check_flag("causal", causal),
                          has_mask=bool(mask), dropout_p=dropout_p, seed=seed, dtype=dtype,
                          block_sparsity=check_block_sparsity(block_sparsity), window=check_window(window),
                          page_size=check_page_size(page_size), sinks=check_flag("sinks", sinks),
                          latent=check_flag("latent", latent),
                          flex=check_flex_mask(block_mask, shape),
                          score_mod=check_score_mod(score_mod)), docs)


def simulation_bytes(algorithm, *, N, d, N_k=None, batch=1, heads=1, mask=False, kv_heads=None, d_v=None) -> int:
    """Bytes a numeric simulation holds for its HBM tensors: float64 data, one byte per mask element."""
    pb = count_problem(N, d, N_k, batch, heads, mask=mask, dtype="float64", kv_heads=kv_heads, d_v=d_v)
    return sum(_heads(t, pb) * rows * cols * (1 if t.element == "mask" else 8)
               for t in get_algorithm(algorithm).hbm_tensors(pb) for rows, cols in [t.shape(pb)])


def _heads(t, pb: Problem) -> int:
    """How many (batch·)heads of tensor ``t`` HBM holds: batch·kv_heads for K and V, else batch·heads."""
    return pb.shape.bkv if t.kv else pb.shape.bh


def new_memory(p: Plan, data: dict | None = None) -> Memory:
    """A pass's memory: every HBM tensor its algorithm declares, inputs filled from ``data``.

    ``data`` maps tensor names to arrays for a numeric run; None makes it count-only.
    Tensors with one block per K/V split are sized by the plan's tiling.
    """
    pb = p.run_problem
    mem = Memory(p.M, bh=pb.shape.bh, numeric=data is not None)
    for t in p.algorithm.hbm_tensors(pb):
        mem.add_tensor(t.name, *t.shape(pb, p.tiling), pb.itemsize(t.element), data=(data or {}).get(t.name),
                       heads=_heads(t, pb))
    return mem


Progress = Callable[[int, int], None]  # (work done, total work): FLOPs and exponentials of a numeric run


def work(p: Plan) -> int:
    """The arithmetic of one pass (FLOPs and exponentials), from a count-only run: what a numeric run reports."""
    return sum(f.matmul + f.exp for f in (mem.flops() for _, mem in execute_parts(p)))


def execute_parts(p: Plan, data: dict | None = None, on_progress: Progress | None = None, before: int = 0,
                  total: int = 0) -> list[tuple[Plan, Memory]]:
    """Run every part of a pass (``Plan.parts``: one per document length), each on its documents' inputs."""
    runs = []
    for part in p.parts():
        mem = execute(part, None if data is None else part_inputs(data, p.problem, part.problem), on_progress,
                      before, total)
        before += mem.flops().matmul + mem.flops().exp
        runs.append((part, mem))
    return runs


def part_inputs(data: dict, pb: Problem, part: Problem) -> dict:
    """The inputs of one part of a pass on ``pb`` (``Plan.parts``): a group of heads' of a per-head block mask, one
    length's documents, or ``data`` itself."""
    if pb.flex is not None and pb.flex.per_head:
        return gather_heads(data, pb, part)
    return gather(data, pb, part)


def unpacked(pb: Problem, runs: list[tuple[Plan, Memory]], name: str, cols: int) -> np.ndarray:
    """A tensor of a numeric pass on ``pb`` as the caller's arrays hold it: (batch, heads, N, cols), or packed
    documents' (1, heads, Σ L_b, cols)."""
    parts = [(part.problem, mem.tensor(name)) for part, mem in runs]
    if pb.flex is not None and pb.flex.per_head:
        return scatter_heads(pb, parts, cols)
    return scatter(pb, parts, cols)


def execute(p: Plan, data: dict | None = None, on_progress: Progress | None = None, before: int = 0,
            total: int = 0) -> Memory:
    """Run one pass on a new memory (count-only without ``data``) and return the memory, counts and HBM in it.

    ``on_progress`` sees (``before`` + this pass's work so far, ``total``) after each step.
    """
    mem = new_memory(p, data)
    if on_progress is not None:
        if not callable(on_progress):
            raise InputTypeError(f"on_progress={on_progress!r} must be a function of (done, total) or None")
        mem.on_compute = lambda f: on_progress(before + f.matmul + f.exp, total)
    p.algorithm.run(mem, p.run_problem, p.tiling)
    return mem


def measure(request: Request, gpu: str | None = None) -> SimResult:
    """Count a request's passes (count-only): their traffic and arithmetic added; ``gpu`` the preset of its
    ``dram``."""
    mems = [execute(part) for p in request.plans for part in p.parts()]
    flops = mems[0].flops()
    for mem in mems[1:]:
        flops = flops + mem.flops()
    return SimResult(request.name, request.problem, request.M, _tiling(request.forward), _tiling(request.backward),
                     combined(*(mem.counts() for mem in mems)), flops=flops, gpu=gpu, plans=request.plans)


def closed_form(request: Request) -> PredictResult:
    """A request's closed forms: every pass's exact counts, paper's form and arithmetic, added."""
    plans = request.plans
    flops = [p.flops() for p in plans]
    return PredictResult(request.name, request.problem, request.M, _tiling(request.forward),
                         _tiling(request.backward), combined(*(p.exact() for p in plans)),
                         sum(p.paper() for p in plans), " + ".join(p.algorithm.paper_label for p in plans),
                         None if None in flops else sum(flops[1:], flops[0]), plans=plans)


def _tiling(p: Plan | None) -> Tiling | None:
    return None if p is None else p.tiling


def numeric_inputs(q, k, v, *, causal, mask, scale, dropout_p, seed, dtype, block_sparsity=None, window=None,
                   allow_nonfinite=False, page_size=None, seqlens=None, cu_seqlens=None, sinks=None, latent=False,
                   block_mask=None, score_mod=None) -> tuple[Problem, dict]:
    """The problem of a numeric run, and its HBM inputs by tensor name (Q, K, V, the mask and the sinks); with packed
    documents (iosim.variants.varlen), q, k, v are (1, heads, Σ L_b, d)."""
    q, k, v = (listed_array(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    shape = check_qkv(q, k, v)
    q, k, v = (np.asarray(x) for x in (q, k, v))
    check_values({"q": q, "k": k, "v": v}, allow_nonfinite)
    if isinstance(mask, (bool, np.bool_)):
        raise InputTypeError(f"mask={mask!r}: simulate takes a boolean array (True = attend) or None; count and "
                             f"predict take mask=True or False")
    full_mask = check_mask(mask, shape)
    sink_logits = None if sinks is None else check_sinks(sinks, shape.heads)
    if check_flag("latent", latent) and not (shape.d_v <= shape.d and np.array_equal(
            v, k[..., :shape.d_v], equal_nan=bool(allow_nonfinite))):
        raise InputError(f"latent=True with v of shape {v.shape} and k of {k.shape}: MLA's latent cache has V as the "
                         f"first d_v columns of K; allowed: v equal to k[..., :d_v]")
    pb = Problem(shape, tau=check_scale(scale, shape.d), causal=check_flag("causal", causal),
                 has_mask=full_mask is not None, dropout_p=dropout_p, seed=seed, dtype=dtype,
                 block_sparsity=check_block_sparsity(block_sparsity), window=check_window(window),
                 page_size=check_page_size(page_size), sinks=sink_logits is not None, latent=latent,
                 flex=check_flex_mask(block_mask, shape), score_mod=check_score_mod(score_mod))
    docs = check_seqlens(seqlens, cu_seqlens)
    if docs is not None and not shape.n_q == shape.n_k == sum(docs):
        raise InputError(f"q of {shape.n_q} and k of {shape.n_k} tokens with seqlens of {sum(docs)}: packed "
                         f"documents take q, k, v of (1, heads, Σ seqlens, d)")
    pb = packed(pb, docs)
    data = {"Q": q, "K": k, "V": v}
    if full_mask is not None:
        data["mask"] = full_mask
    if sink_logits is not None:  # one 1 × 1 block per batch·head, as HBM holds a tensor
        data["sinks"] = np.broadcast_to(sink_logits[None, :, None, None], (shape.batch, shape.heads, 1, 1))
    return pb, data


def simulate(algorithm, q, k, v, *, M, causal=False, mask=None, scale=None, dropout_p=0.0, seed=0,
             block_policy="fit", tiling=None, dtype="float16", block_sparsity=None, splits=None, gpu=None,
             window=None, allow_nonfinite=False, on_progress: Progress | None = None, page_size=None, seqlens=None,
             cu_seqlens=None, sinks=None, latent=False, block_mask=None, score_mod=None) -> SimResult:
    """Run ``algorithm`` numerically on q (batch, heads, N_q, d), k (batch, kv_heads, N_k, d) and v (batch,
    kv_heads, N_k, d_v): V's head size may differ from Q's and K's (MLA's heads), and the output has V's.

    kv_heads divides heads (grouped-query attention; kv_heads = heads is multi-head
    attention). ``splits`` sets the K/V splits of an algorithm that splits K/V
    (``split-kv``), whose default policy chooses them otherwise, to fill the SMs of the
    ``gpu`` preset (an H100 when None; ``iosim.dram`` gives the DRAM bytes behind a preset's L2).
    Computation is in float64; ``dtype`` sets the bytes per element of the traffic
    report and how a byte-sized M (e.g. "192KiB") converts to elements.
    ``block_sparsity`` (an ``iosim.BlockSparsity``) is the block mask of the
    block-sparse algorithms; the others refuse it. ``window=(left, right)`` is a sliding
    window as flash-attn's ``window_size`` (−1: unbounded on that side; ``iosim.Band``),
    bottom-right aligned; with ``causal=True`` its right side is 0. Q, K and V must be real and finite
    unless ``allow_nonfinite`` asks to propagate inf and NaN to the output.
    ``on_progress(done, total)`` sees the work (FLOPs and exponentials) after each step.
    ``page_size`` reads K and V from a paged cache of pages of that many tokens (iosim.variants.paging).
    ``seqlens`` (or ``cu_seqlens``) packs documents end to end (iosim.variants.varlen): q, k, v are (1, heads, Σ L_b, d)
    and so is the output, each document attending only to itself. ``sinks``, one logit per query head (shape
    (heads,)), are learned attention sinks (gpt-oss): each row's softmax takes its head's sink as one more score,
    whose weight goes to no value; flash, flash-swapped and split-kv take them (flash's and flash-swapped's backward
    too, in ``iosim.gradients``). ``latent=True`` reads K and V as MLA's latent cache, v being k's first d_v
    columns: K alone is read (split-kv and flash-swapped take it). ``block_mask`` (``iosim.block_mask``) is the
    FlexAttention block mask that ``flex`` runs over, and ``score_mod`` (``iosim.variants.score_mods.score_mod``) a
    score_mod its forward applies.
    """
    pb, data = numeric_inputs(q, k, v, causal=causal, mask=mask, scale=scale, dropout_p=dropout_p, seed=seed,
                              dtype=dtype, block_sparsity=block_sparsity, window=window,
                              allow_nonfinite=allow_nonfinite, page_size=page_size, seqlens=seqlens,
                              cu_seqlens=cu_seqlens, sinks=sinks, latent=latent, block_mask=block_mask,
                              score_mod=score_mod)
    p = plan(algorithm, pb, M, block_policy=block_policy, tiling=tiling, splits=splits, gpu=gpu).forward
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow of tau·QKᵀ is reported by name below
        runs = execute_parts(p, data, on_progress, total=work(p) if on_progress else 0)
    flops = [mem.flops() for _, mem in runs]
    result = SimResult(p.algorithm.name, pb, p.M, p.tiling, None, combined(*(mem.counts() for _, mem in runs)),
                       flops=sum(flops[1:], flops[0]), out=unpacked(pb, runs, "O", pb.shape.d_v), gpu=gpu, plans=(p,))
    if {"l", "m"} <= set(p.algorithm.outputs()):
        result = replace(result, l=unpacked(pb, runs, "l", 1)[..., 0], m=unpacked(pb, runs, "m", 1)[..., 0])
    if not np.isfinite(result.out).all() and all(np.isfinite(data[n]).all() for n in ("Q", "K", "V")):
        warnings.warn(f"scale={pb.tau!r}: tau·QKᵀ overflowed float64 (finite inputs gave a non-finite output); "
                      f"float64 holds magnitudes below 1.8e308", RuntimeWarning, stacklevel=2)
    return result


def count(algorithm, *, N=None, d, M, N_k=None, batch=1, heads=1, causal=False, mask=False, dropout_p=0.0,
          seed=0, block_policy="fit", tiling=None, dtype="float16", pass_="fwd", block_sparsity=None,
          kv_heads=None, splits=None, gpu=None, window=None, page_size=None, seqlens=None, cu_seqlens=None,
          sinks=False, d_v=None, latent=False, block_mask=None, score_mod=None) -> SimResult:
    """Run ``algorithm`` count-only: tiles carry shapes, nothing is computed.

    N is N_q; N_k defaults to N. ``mask=True`` counts the reads of an explicit mask.
    ``pass_="bwd"`` counts the backward pass alone; ``pass_="fwd+bwd"`` both, their
    traffic and arithmetic added (the peak is the larger pass's). ``gpu`` names the
    preset whose SMs split-kv's default splits fill (an H100 when None); ``iosim.dram`` gives the DRAM bytes a
    preset's L2 lets through.
    ``window=(left, right)`` is a sliding window, as ``simulate`` takes it. ``page_size`` reads K and V
    from a paged cache through a block table (iosim.variants.paging). ``seqlens`` (or ``cu_seqlens``) counts documents
    packed end to end instead of N (iosim.variants.varlen); the result's ``padded`` is their traffic padded to the
    longest. ``sinks=True`` counts each query head's learned attention sink, as ``simulate`` reads it. ``d`` is the
    head size of Q and K and ``d_v`` that of V and O (None: d), as MLA's heads differ; ``latent=True`` counts MLA's
    latent cache, V being the first d_v columns of K (one tensor read), as ``simulate`` takes it; ``block_mask`` is
    the FlexAttention block mask ``flex`` runs over (``iosim.block_mask``), ``score_mod`` its forward's score_mod.
    """
    pb = count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p, seed=seed,
                       dtype=dtype, block_sparsity=block_sparsity, kv_heads=kv_heads, window=window,
                       page_size=page_size, seqlens=seqlens, cu_seqlens=cu_seqlens, sinks=sinks, d_v=d_v,
                       latent=latent, block_mask=block_mask, score_mod=score_mod)
    return measure(plan(algorithm, pb, M, pass_=pass_, block_policy=block_policy, tiling=tiling, splits=splits,
                        gpu=gpu), gpu)


def predict(algorithm, *, N=None, d, M, N_k=None, batch=1, heads=1, causal=False, mask=False, dropout_p=0.0,
            block_policy="fit", tiling=None, dtype="float16", pass_="fwd", block_sparsity=None,
            kv_heads=None, splits=None, gpu=None, window=None, page_size=None, seqlens=None,
            cu_seqlens=None, sinks=False, d_v=None, latent=False, block_mask=None, score_mod=None) -> PredictResult:
    """The exact closed-form traffic of ``algorithm``, and the paper's asymptotic form beside it.

    ``pass_="bwd"`` predicts the backward pass alone; ``pass_="fwd+bwd"`` both, as ``count``
    adds them (the paper's forms added too).
    """
    pb = count_problem(N, d, N_k, batch, heads, causal=causal, mask=mask, dropout_p=dropout_p, dtype=dtype,
                       block_sparsity=block_sparsity, kv_heads=kv_heads, window=window, page_size=page_size,
                       seqlens=seqlens, cu_seqlens=cu_seqlens, sinks=sinks, d_v=d_v, latent=latent,
                       block_mask=block_mask, score_mod=score_mod)
    return closed_form(plan(algorithm, pb, M, pass_=pass_, block_policy=block_policy, tiling=tiling, splits=splits,
                            gpu=gpu))
