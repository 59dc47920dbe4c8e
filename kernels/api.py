"""Host API: check the inputs, move them to the device, launch an implementation, shape the results.

    out, lse = kernels.attention(q, k, v, impl="flash-swapped", causal=True)
    dq, dk, dv = kernels.attention_backward(q, k, v, out, lse, dout, impl="flash-swapped", causal=True)

q is (batch, heads, N_q, d) and k, v are (batch, heads, N_k, d), all float32 or all
float16 (accumulation is float32 either way). They may be numpy arrays, Numba device
arrays or anything with ``__cuda_array_interface__`` (a CUDA torch tensor, say). Results
are numpy arrays when q is a numpy array and Numba device arrays otherwise.

bfloat16, which numpy lacks, is asked for by name and runs the implementations that take
it (flash-swapped-tc), forward and backward:

    out, lse = kernels.attention(q, k, v, impl="flash-swapped-tc", dtype="bfloat16")
    dq, dk, dv = kernels.attention_backward(q, k, v, out, lse, dout, impl="flash-swapped-tc", dtype="bfloat16")

with q, k, v (out, dout) either float32 numpy arrays, rounded to bfloat16 on the host (to
nearest, ties to even; kernels.bfloat16), and then the results come back as float32
holding bfloat16 values, or uint16 bfloat16 bit patterns (numpy or device arrays), and
then they come back as bit patterns too.

Every check runs before any launch and raises ValueError or TypeError naming the
parameter, its value and the allowed range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np
from numba import cuda

from iosim.core.errors import InputError
from iosim.core.inputs import AttentionShape, check_dout, check_qkv, check_scale
from iosim.kernels import bfloat16 as bf16
from iosim.kernels import flash, flash_swapped, flash_swapped_tc, split_kv, standard
from iosim.kernels.config import Dropout

if TYPE_CHECKING:
    from iosim.algorithms.algorithm import Algorithm


@runtime_checkable
class Implementation(Protocol):
    """What the host API asks of an implementation module (kernels/flash.py, ...): one per IMPLS entry.

    The API checks every input, flattens batch and heads, and hands the module device arrays
    q (bh, N_q, d), k, v (bh, N_k, d), or (b·kv_heads, N_k, d) to a GROUPED_FORWARD forward, in one dtype (float32,
    float16, or uint16 bfloat16 bits where BFLOAT16); the module launches its kernels and returns device arrays. A
    module whose ALGORITHM has no backward pass (split-kv) is forward only: the API refuses its backward.
    """

    ALGORITHM: Algorithm  # the registered iosim algorithm whose HBM traffic the kernels realise
    BFLOAT16: bool  # whether the API may hand it bfloat16; if so it is also a TakesBfloat16
    GROUPED_FORWARD: bool  # whether its forward takes k, v of b·kv_heads heads for q of b·heads (grouped-query)
    SPLITS: bool  # whether its forward splits K/V and takes splits= (attention(splits=...); split-kv)
    SAWTOOTH: bool  # whether its forward takes sawtooth= (odd query blocks scan K/V backward; flash-swapped)
    FORWARD_TILES: Sequence  # tilings the forward prefers, best first; the API takes the first that fits d
    BACKWARD_TILES: Sequence  # the same for the backward

    def check_config(self, config, d: int, backward: bool) -> None:
        """Raise ValueError (TypeError for a config of the wrong kind) naming config or d when they cannot run."""

    def forward(self, q, k, v, *, tau: float, causal: bool, dropout: Dropout, config):
        """(O (bh, N_q, d) in q's dtype, lse (bh, N_q) float32: log Σ_j exp(S_ij), −inf on fully masked rows).
        A SPLITS module's forward also takes splits (an int the API has checked), a SAWTOOTH one sawtooth."""

    def backward(self, q, k, v, out, lse, dout, *, tau: float, causal: bool, dropout: Dropout, config):
        """(dQ, dK, dV) in q's dtype, from forward's out and lse for the same inputs and options."""


@runtime_checkable
class TakesBfloat16(Implementation, Protocol):
    """An Implementation with BFLOAT16 = True: it says at which head dims bfloat16 can run."""

    def check_bfloat16(self, d: int, backward: bool) -> None:
        """Raise ValueError naming d where bfloat16 cannot run at head dim d."""


# The one registry of implementations: the host API, the benchmark and the tests all read it.
# Each module is an Implementation; its ALGORITHM is the registered iosim.Algorithm it implements.
IMPLS: dict[str, Implementation] = {
    "standard": standard,  # Algorithm 0: S and P materialised in HBM
    "flash": flash,  # Algorithms 1/2 and 4 in the paper's loop order (K/V outer)
    "flash-swapped": flash_swapped,  # FlashAttention-2 order (Q outer), the fast path
    "flash-swapped-tc": flash_swapped_tc,  # flash-swapped on tensor cores (float16, bfloat16)
    "split-kv": split_kv,  # Flash-Decoding: K/V split over thread blocks, then combined; forward only
}

DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
BFLOAT16 = "bfloat16"
COMPUTE_DTYPES = (None, BFLOAT16)  # attention(dtype=...): None runs the inputs' own dtype
# modules that take bfloat16 say so (BFLOAT16), and check_bfloat16(d, backward) says at which head dims
BFLOAT16_IMPLS = [name for name, module in IMPLS.items() if module.BFLOAT16]
# the impls with a backward pass (attention_backward); split-kv is forward only, as iosim's split-kv
BACKWARD_IMPLS = [name for name, module in IMPLS.items() if module.ALGORITHM.backward is not None]
BFLOAT16_INPUTS = (np.dtype(np.float32), bf16.BITS)  # rounded on the host, or bit patterns as they are
MAX_HEAD_DIM_SEARCH = 4096  # head dims tried; one that fits all of them counts as unlimited


class KernelOutput(NamedTuple):
    """What the forward pass returns; unpacks as ``out, lse``."""

    out: object  # (batch, heads, N_q, d), the input dtype
    lse: object  # (batch, heads, N_q), float32: log Σ_j exp(S_ij), −inf on fully masked rows


def implementation(impl: str) -> Implementation:
    """The module registered under `impl`, or ValueError listing the allowed names."""
    try:
        return IMPLS[impl]
    except (KeyError, TypeError):
        raise ValueError(f"impl={impl!r} is not one of {sorted(IMPLS)}") from None


def with_backward(impl: str) -> Implementation:
    """The module registered under `impl`, which must have a backward pass (InputError naming those that do)."""
    module = implementation(impl)
    if impl not in BACKWARD_IMPLS:
        raise InputError(f"impl={impl!r} is forward only (decoding has no gradients; iosim's {module.ALGORITHM.name} "
                         f"has no backward either); backward passes: {BACKWARD_IMPLS}")
    return module


def max_head_dim(impl: str, backward: bool = False) -> int | None:
    """Largest d that the smallest preferred tiling of `impl` can run, or None when d is not limited.

    Shared memory is the limit of the fused kernels; standard's matmuls tile over d.
    """
    module = with_backward(impl) if backward else implementation(impl)
    smallest = (module.BACKWARD_TILES if backward else module.FORWARD_TILES)[-1]
    for d in range(1, MAX_HEAD_DIM_SEARCH + 1):
        try:
            module.check_config(smallest, d, backward)
        except ValueError:
            return d - 1
    return None


def resolve_config(impl: str, d: int, backward: bool, config=None):
    """The tiling to launch with: `config` checked, or the first preferred tiling that fits d."""
    module = with_backward(impl) if backward else implementation(impl)
    if config is not None:
        module.check_config(config, d, backward)
        return config
    for candidate in module.BACKWARD_TILES if backward else module.FORWARD_TILES:
        try:
            module.check_config(candidate, d, backward)
        except ValueError:
            continue
        return candidate
    raise ValueError(
        f"d={d} is outside the allowed range [1, {max_head_dim(impl, backward)}] for impl={impl!r} "
        f"({'backward' if backward else 'forward'}): its tiles would not fit in shared memory"
    )


def _common_dtype(named: dict, allowed, allowed_text: str) -> np.dtype:
    """The one dtype every array in ``named`` shares, from ``allowed``; a TypeError naming the array otherwise."""
    dtypes = {name: np.dtype(x.dtype) for name, x in named.items()}
    first_name, first = next(iter(dtypes.items()))
    for name, dt in dtypes.items():
        if dt not in allowed:
            raise TypeError(f"{name} has dtype {dt}; {allowed_text}")
        if dt != first:
            raise TypeError(f"{name} has dtype {dt} but {first_name} has {first}; all must share one dtype")
    return first


def _check_dtypes(named: dict) -> np.dtype:
    return _common_dtype(named, DTYPES, "allowed dtypes are float32 and float16 (and bfloat16 through "
                                        "dtype='bfloat16')")


def _as_bfloat16(impl: str, dtype, named: dict) -> tuple[list, bool]:
    """The arrays as bfloat16 bit patterns, and whether the results should come back as float32 values.

    float32 numpy arrays are rounded here; uint16 arrays are taken as bit patterns.
    """
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {list(COMPUTE_DTYPES)}")
    if impl not in BFLOAT16_IMPLS:
        raise ValueError(f"dtype={dtype!r} needs impl in {BFLOAT16_IMPLS}; got impl={impl!r}")
    first = _common_dtype(named, BFLOAT16_INPUTS, "with dtype='bfloat16' allowed dtypes are float32 (rounded on "
                                                  "the host) and uint16 (bfloat16 bit patterns)")
    if first == bf16.BITS:
        return list(named.values()), False
    for name, x in named.items():
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} is a float32 device array; with dtype='bfloat16' float32 inputs must be "
                            f"numpy arrays (rounded on the host) or device inputs uint16 bfloat16 bit patterns")
    return [bf16.to_bfloat16(x) for x in named.values()], True


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be a bool")
    return bool(value)


def _as_array(name: str, x):
    """A numpy array, or a Numba device array (wrapping __cuda_array_interface__ objects)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "copy_to_host"):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return np.asarray(x)
    raise TypeError(f"{name} must be a numpy array or a CUDA device array; got {type(x).__name__}")


def _to_device(name: str, x, flat_shape):
    """x on the device with batch and heads merged, e.g. (batch·heads, N, d); device arrays are not copied."""
    if isinstance(x, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(x).reshape(flat_shape))
    if not x.is_c_contiguous():
        raise ValueError(f"{name} must be a C-contiguous device array")
    return x.reshape(flat_shape)


def _finish(x, shape, on_host: bool):
    x = x.reshape(shape)
    return x.copy_to_host() if on_host else x


def _check_heads(shape: AttentionShape, impl: str | None = None) -> AttentionShape:
    """k, v with as many heads as q, or fewer (grouped-query attention) for the forward of an implementation
    that takes them (``impl``, GROUPED_FORWARD); backward passes take kv_heads == heads. Every kernel takes v of q's
    and k's head size."""
    if shape.d_v != shape.d:
        raise InputError(f"v of head size d_v={shape.d_v} beside q, k of d={shape.d}: iosim's kernels take one head "
                         f"size for q, k and v; allowed: d_v = d (the simulator, iosim.simulate, takes them apart)")
    if shape.kv_heads != shape.heads and (impl is None or not IMPLS[impl].GROUPED_FORWARD):
        grouped = [name for name, module in IMPLS.items() if module.GROUPED_FORWARD]
        raise InputError(f"kv_heads={shape.kv_heads}: {'the backward kernels' if impl is None else impl} take k and v "
                         f"with heads={shape.heads} heads, as many as q; grouped-query attention runs on the "
                         f"forward of {grouped} (and on the simulator)")
    return shape


def attention(
    q, k, v, *, impl="flash-swapped", causal=False, scale=None, dropout_p=0.0, seed=0, config=None, dtype=None,
    splits=None, sawtooth=False,
):
    """Attention forward on the GPU: O = dropout(softmax(MASK(tau Q Kᵀ))) V and its logsumexp.

    q (batch, heads, N_q, d), k and v (batch, kv_heads, N_k, d), kv_heads = heads but for an implementation
    that takes grouped-query attention (kv_heads dividing heads; flash-swapped); causal masking is aligned
    bottom-right (query i sees key j iff j <= i + N_k − N_q); scale defaults to 1/sqrt(d);
    dropout uses iosim.core.rng's Philox stream, so the mask equals the simulator's bit for bit.
    `config` overrides the implementation's tile sizes (a TileConfig, or a
    standard.MatmulConfig for impl="standard"). dtype="bfloat16" runs bfloat16 (see the
    module docstring for the inputs it takes); None runs the inputs' dtype. `splits` is
    impl="split-kv"'s number of K/V splits, 1 to ⌈N_k/B_c⌉ (None: enough to fill the device's
    SMs, kernels/split_kv.py). `sawtooth=True` has impl="flash-swapped"'s odd query blocks visit
    their key blocks last to first (the same attention; docs/gpu.md says what the L2 makes of it).
    Returns KernelOutput(out, lse).
    """
    module = implementation(impl)
    if splits is not None and not module.SPLITS:
        raise InputError(f"splits={splits!r}: impl={impl!r} does not split K/V; splits= is for "
                         f"{[name for name, m in IMPLS.items() if m.SPLITS]}")
    if _check_bool("sawtooth", sawtooth) and not module.SAWTOOTH:
        raise InputError(f"sawtooth=True: impl={impl!r} has one K/V order; sawtooth= is for "
                         f"{[name for name, m in IMPLS.items() if m.SAWTOOTH]}")
    q, k, v = (_as_array(n, x) for n, x in (("q", q), ("k", k), ("v", v)))
    shape = _check_heads(check_qkv(q, k, v), impl)
    widen = False
    if dtype is None:
        _check_dtypes({"q": q, "k": k, "v": v})
    else:
        (q, k, v), widen = _as_bfloat16(impl, dtype, {"q": q, "k": k, "v": v})
        module.check_bfloat16(shape.d, backward=False)
    causal = _check_bool("causal", causal)
    tau = check_scale(scale, shape.d)
    dropout = Dropout.checked(dropout_p, seed)
    config = resolve_config(impl, shape.d, False, config)
    options = {"splits": module.resolve_splits(splits, shape, causal, config)} if module.SPLITS else {}
    if sawtooth:
        options["sawtooth"] = True

    on_host = isinstance(q, np.ndarray)
    qd = _to_device("q", q, (shape.bh, shape.n_q, shape.d))
    kd = _to_device("k", k, (shape.bkv, shape.n_k, shape.d))
    vd = _to_device("v", v, (shape.bkv, shape.n_k, shape.d))
    out, lse = module.forward(qd, kd, vd, tau=tau, causal=causal, dropout=dropout, config=config, **options)
    out = _finish(out, (shape.batch, shape.heads, shape.n_q, shape.d), on_host)
    return KernelOutput(
        out=bf16.from_bfloat16(out) if widen else out,
        lse=_finish(lse, (shape.batch, shape.heads, shape.n_q), on_host),
    )


def _check_forward_outputs(out, lse, shape: AttentionShape, dtype: np.dtype) -> None:
    want = (shape.batch, shape.heads, shape.n_q, shape.d)
    if tuple(out.shape) != want:
        raise ValueError(f"out must have shape {want}; got {tuple(out.shape)}")
    if np.dtype(out.dtype) != dtype:
        raise TypeError(f"out has dtype {out.dtype}; it must match q's dtype {dtype}")
    want_lse = want[:3]
    if tuple(lse.shape) != want_lse:
        raise ValueError(f"lse must have shape {want_lse}; got {tuple(lse.shape)}")
    if not isinstance(lse, np.ndarray) and np.dtype(lse.dtype) != np.float32:
        raise TypeError(f"lse on the device must be float32; got {lse.dtype}")


def attention_backward(
    q, k, v, out, lse, dout, *, impl="flash-swapped", causal=False, scale=None, dropout_p=0.0, seed=0, config=None,
    dtype=None,
):
    """Gradients (dq, dk, dv) of `attention` for upstream gradient dout (batch, heads, N_q, d).

    out and lse are attention()'s outputs for the same q, k, v and options; dout has q's
    shape and dtype. dtype="bfloat16" runs bfloat16, taking q, k, v, out, dout as
    `attention` takes q, k, v with it. Returns dq, dk, dv in the input dtype. Forward-only impls
    (split-kv) are refused.
    """
    module = with_backward(impl)
    q, k, v, out, lse, dout = (
        _as_array(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse), ("dout", dout))
    )
    shape = _check_heads(check_qkv(q, k, v))
    widen = False
    if dtype is None:
        dtype = _check_dtypes({"q": q, "k": k, "v": v})
        _check_dtypes({"q": q, "dout": dout})
    else:
        (q, k, v, out, dout), widen = _as_bfloat16(impl, dtype, {"q": q, "k": k, "v": v, "out": out, "dout": dout})
        module.check_bfloat16(shape.d, backward=True)
        dtype = np.dtype(q.dtype)
    check_dout(dout, shape)
    _check_forward_outputs(out, lse, shape, dtype)
    causal = _check_bool("causal", causal)
    tau = check_scale(scale, shape.d)
    dropout = Dropout.checked(dropout_p, seed)
    config = resolve_config(impl, shape.d, True, config)

    on_host = isinstance(q, np.ndarray)
    rows = (shape.bh, shape.n_q, shape.d)
    keys = (shape.bh, shape.n_k, shape.d)
    if isinstance(lse, np.ndarray):
        lse = lse.astype(np.float32)
    grads = module.backward(
        _to_device("q", q, rows),
        _to_device("k", k, keys),
        _to_device("v", v, keys),
        _to_device("out", out, rows),
        _to_device("lse", lse, (shape.bh, shape.n_q)),
        _to_device("dout", dout, rows),
        tau=tau,
        causal=causal,
        dropout=dropout,
        config=config,
    )
    dq, dk, dv = grads
    four_d_q = (shape.batch, shape.heads, shape.n_q, shape.d)
    four_d_k = (shape.batch, shape.heads, shape.n_k, shape.d)
    grads = _finish(dq, four_d_q, on_host), _finish(dk, four_d_k, on_host), _finish(dv, four_d_k, on_host)
    return tuple(bf16.from_bfloat16(g) for g in grads) if widen else grads
