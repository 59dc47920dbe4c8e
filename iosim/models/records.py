"""A model report as records: one per (phase, algorithm, kind of layer), what ``model --json`` and ``--csv`` save."""

from __future__ import annotations

from iosim.core.tiling import tiling_record
from iosim.gpu.l2 import dram_record
from iosim.models.cost import ModelReport


def records(report: ModelReport) -> list[dict]:
    """One record per (phase, algorithm, kind of layer): the layer's counts, and the model's totals beside them.

    A skipped algorithm has one record per phase, its reason under ``status``.
    """
    cfg, out = report.model, []
    kv = cfg.kv_cache_bytes(report.dtype)
    base = dict(model=cfg.name, source=cfg.source, batch=report.batch, heads=cfg.heads, d=cfg.head_dim, d_v=cfg.d_v,
                gpu=report.gpu, dtype=report.dtype, M=report.M, kv_cache_bytes_per_token=kv["per_token"],
                kv_cache_bytes_per_token_layer=kv["per_layer"])
    for pc in report.phases:
        ph = pc.phase
        for a in pc.algorithms:
            head = dict(base, phase=ph.name, **{"pass": ph.pass_}, N=ph.n_q, N_k=ph.n_k, algorithm=a.algorithm)
            model_totals = dict(model_total_bytes=a.total_bytes, model_matmul_flops=getattr(a.flops, "matmul", None),
                                model_roofline_s=a.seconds, ratio_to_least=pc.ratio(a),
                                least=pc.least is not None and pc.least.algorithm == a.algorithm)
            if a.skipped:
                out.append(dict(head, **model_totals, status=a.skipped))
            for c in a.layers:
                f, b = c.forward_tiling, c.backward_tiling
                out.append(dict(head, layer_kind=c.kind.label, layers=c.kind.layers, window=c.kind.window,
                                chunk=c.kind.chunk,
                                counted_window=None if c.window is None else list(c.window), kv_heads=c.kv_heads,
                                counted_d=c.d, counted_d_v=c.d_v, latent=c.latent,
                                **tiling_record(f), **tiling_record(b, "bwd_"),
                                **c.counts.as_dict(), exact=c.exact, matmul_flops=c.flops.matmul, exp=c.flops.exp,
                                roofline_s=c.roofline.seconds, bound=c.roofline.bound,
                                intensity=c.roofline.intensity, time_from=c.time_from, **dram_record(c.dram),
                                dram_note=c.dram_note, **model_totals, status="ok"))
    return out
