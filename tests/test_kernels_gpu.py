"""The kernels on a real GPU at sizes the CUDA simulator cannot reach, against float64 torch.

Run with ``IOSIM_GPU=1 python -m pytest tests/test_kernels_gpu.py`` on a machine with a
CUDA GPU and PyTorch. Under the simulator (the default, and CI) every test here is
skipped: N = 16384 would take the simulator days, one Python thread per GPU thread.

Each case runs forward and backward with the impl's default (hardware-sized) tiling and
compares out, lse, dq, dk and dv with float64 attention computed by torch on the GPU (out and
lse alone for split-kv, which has no backward: call 4 found the test asking it for one).
The tolerance follows tests/test_kernels.py: 4× the error of the same algebra run by
torch in the kernel's precision (TF32 off), plus 2 ulps of the largest reference value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from iosim import kernels
from iosim.core.problem import AttentionShape, causal_keep
from iosim.kernels._device import simulator_enabled
from iosim.kernels.api import BACKWARD_IMPLS
from iosim.reference import dropout_scale_matrix

pytestmark = pytest.mark.skipif(
    simulator_enabled(),
    reason="needs a CUDA GPU and torch: run with IOSIM_GPU=1 (N up to 16384 is out of the simulator's reach)",
)

IMPLS = list(kernels.IMPLS)


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    dtype: str
    causal: bool = False
    dropout_p: float = 0.0
    seed: int = 0

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(self.batch, self.heads, self.n_q, self.n_k, self.d)


CASES = {
    "N=4096,d=64,causal,float32,bh=2": Case(1, 2, 4096, 4096, 64, "float32", causal=True),
    "N=4096,d=128,dropout,float16": Case(1, 1, 4096, 4096, 128, "float16", dropout_p=0.1, seed=2**40 + 3),
    "Nq=3000<Nk=4096,d=64,causal,dropout,float16": Case(
        1, 1, 3000, 4096, 64, "float16", causal=True, dropout_p=0.2, seed=11
    ),
    "N=16384,d=64,causal,float16": Case(1, 1, 16384, 16384, 64, "float16", causal=True),
    "N=16384,d=128,float32": Case(1, 1, 16384, 16384, 128, "float32"),
}


def torch_attention(q, k, v, dout, case: Case, dtype, grads: bool = True):
    """out, lse, dq, dk, dv of attention computed by torch in `dtype` (autograd for the gradients); out and lse alone
    without ``grads``."""
    import torch

    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    dout = dout.to(dtype)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(case.d))  # (b, h, N_q, N_k)
    if case.causal:
        keep = torch.as_tensor(causal_keep(case.n_q, case.n_k, slice(0, case.n_q), slice(0, case.n_k)), device=q.device)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    z = dropout_scale_matrix(case.shape, case.dropout_p, case.seed)
    if not isinstance(z, float):
        p = p * torch.as_tensor(z, device=q.device, dtype=dtype)
    out = p @ v
    if not grads:
        return out.detach(), lse.detach()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out.detach(), lse.detach(), dq, dk, dv


def assert_close(name: str, got, ref, lowp, eps: float) -> None:
    """max|got − ref| <= 4 × max|lowp − ref| + 2 eps · max|ref| over finite entries; non-finite ones identical."""
    import torch

    got, ref, lowp = (x.to(torch.float64) for x in (got, ref, lowp))
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(got), finite) or not torch.equal(got[~finite], ref[~finite]):
        raise AssertionError(f"{name}: non-finite entries differ ({int((~finite).sum())} expected)")
    err = float((got[finite] - ref[finite]).abs().max())
    err_lowp = float((lowp[finite] - ref[finite]).abs().max())
    magnitude = float(ref[finite].abs().max())
    tol = 4 * err_lowp + 2 * eps * magnitude
    assert err <= tol, (
        f"{name}: max |kernel − float64| = {err:.3g} > {tol:.3g} "
        f"(4 × low-precision torch error {err_lowp:.3g} + 2 eps × max|ref| {magnitude:.3g})"
    )


@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("impl", IMPLS)
def test_large_cases_match_float64_torch(impl, case_name):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    case = CASES[case_name]
    dtype = getattr(torch, case.dtype)
    gen = torch.Generator(device="cuda").manual_seed(list(CASES).index(case_name))
    rows, keys = (case.batch, case.heads, case.n_q, case.d), (case.batch, case.heads, case.n_k, case.d)
    q, k, v, dout = (
        torch.randn(s, device="cuda", generator=gen, dtype=torch.float32).to(dtype) for s in (rows, keys, keys, rows)
    )
    opts = dict(impl=impl, causal=case.causal, dropout_p=case.dropout_p, seed=case.seed)
    fwd = kernels.attention(q, k, v, **opts)
    out, lse = (torch.as_tensor(x, device="cuda") for x in fwd)
    # split-kv is forward only (its backward is refused, tests/test_kernels_split_kv.py): out and lse
    grads = kernels.attention_backward(q, k, v, out, lse, dout, **opts) if impl in BACKWARD_IMPLS else ()
    got = (out, lse, *(torch.as_tensor(g, device="cuda") for g in grads))
    assert out.dtype == dtype and lse.dtype == torch.float32 and all(g.dtype == dtype for g in got[2:])

    ref = torch_attention(q, k, v, dout, case, torch.float64, grads=bool(grads))
    lowp = torch_attention(q, k, v, dout, case, dtype, grads=bool(grads))
    assert len(got) == len(ref) == len(lowp)
    eps = float(np.finfo(case.dtype).eps)
    for name, g, r, lo in zip(("out", "lse", "dq", "dk", "dv"), got, ref, lowp):
        assert_close(f"{impl} {case_name} {name}", g, r, lo, eps)


BFLOAT16_CASE = Case(1, 2, 4096, 4096, 64, "bfloat16", causal=True, dropout_p=0.1, seed=2**33 + 5)


def test_bfloat16_tensor_cores_match_float64_torch():
    """flash-swapped-tc forward and backward in bfloat16 at N = 4096, against float64 torch.

    The inputs are bfloat16 tensors handed over as float32 numpy arrays (exact), which the
    API takes with dtype="bfloat16"; the tolerance is that of torch's algebra in bfloat16.
    """
    import torch

    case = BFLOAT16_CASE
    gen = torch.Generator(device="cuda").manual_seed(16)
    rows, keys = (case.batch, case.heads, case.n_q, case.d), (case.batch, case.heads, case.n_k, case.d)
    q, k, v, dout = (
        torch.randn(s, device="cuda", generator=gen, dtype=torch.float32).to(torch.bfloat16)
        for s in (rows, keys, keys, rows)
    )
    host = [x.float().cpu().numpy() for x in (q, k, v, dout)]
    opts = dict(impl="flash-swapped-tc", dtype="bfloat16", causal=case.causal, dropout_p=case.dropout_p, seed=case.seed)
    fwd = kernels.attention(*host[:3], **opts)
    grads = kernels.attention_backward(*host[:3], fwd.out, fwd.lse, host[3], **opts)
    got = [torch.as_tensor(x, device="cuda") for x in (*fwd, *grads)]

    ref = torch_attention(q, k, v, dout, case, torch.float64)
    lowp = torch_attention(q, k, v, dout, case, torch.bfloat16)
    for name, g, r, lo in zip(("out", "lse", "dq", "dk", "dv"), got, ref, lowp):
        assert_close(f"flash-swapped-tc bfloat16 {name}", g, r, lo, 2.0**-7)
