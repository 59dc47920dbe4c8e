"""GPU attention benchmark (issue 3, item 7): time, TFLOP/s and peak memory of forward, backward and both.

Each configuration (batch_size, seq_len, num_heads, emb_dim, causal, impl, dtype) is
written, as soon as it finishes, to its own JSON file in seed 002's format:

    {"forward": {"time(s)": ..., "FLOPS(TFLOPs/s)": ...},
     "backward": {...}, "forward_backward": {...},
     "peak_memory_usage(MB)": ...,
     "parameters": {...}, "metadata": {device, versions, git commit, command, ...}}

so a long sweep never loses finished work: files already present are skipped (unless
--overwrite), and an implementation that fails (out of memory, say) records its error
and the sweep goes on. Times are medians over --repeats runs after --warmup runs, each
run bracketed by CUDA events. The FLOP counts are FlashAttention's benchmark convention
(see `flops`). head_dim d = emb_dim / num_heads, as in seed 002.

Implementations: the kernels with a backward pass (kernels.api.BACKWARD_IMPLS: all but the
forward-only split-kv), and where PyTorch is installed "torch" (eager matmul-softmax-matmul,
TF32 off) and "torch-sdpa" (F.scaled_dot_product_attention).

    python -m experiments.gpu_bench --impl flash-swapped torch --seq-len 1024 2048 4096 \\
        --batch-size 16 --num-heads 16 --emb-dim 1024
    python -m experiments.plot_gpu_bench experiments/results/kernels_bench

--smoke runs tiny sizes through every kernel impl; it also runs under Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1), where times are host wall-clock and meaningless.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from iosim import kernels
from iosim.kernels._device import simulator_enabled
from iosim.kernels.api import BACKWARD_IMPLS

REPO = Path(__file__).resolve().parents[1]
TORCH_IMPLS = ("torch", "torch-sdpa")
# --smoke: tiles sized for the simulator (32 threads a block), as in tests/test_kernels.py
SMOKE_TILES = {
    "standard": kernels.MatmulConfig(BM=16, BN=16, BK=16, TM=4, TN=2, row_threads=16),
    "flash": kernels.TileConfig(Br=16, Bc=16, TM=2, TN=4),
    "flash-swapped": kernels.TileConfig(Br=16, Bc=16, TM=2, TN=4),
}
MODES = ("forward", "backward", "forward_backward")
DEFAULT_OUT = REPO / "experiments" / "results" / "kernels_bench"


@dataclass(frozen=True)
class BenchConfig:
    batch_size: int
    seq_len: int
    num_heads: int
    emb_dim: int
    causal: bool
    impl: str
    dtype: str
    tiles: object = None  # a kernels.TileConfig / MatmulConfig overriding the impl's default tiling

    @property
    def head_dim(self) -> int:
        return self.emb_dim // self.num_heads

    def file_name(self) -> str:
        tiles = "" if self.tiles is None else "_tiles" + "-".join(str(x) for x in asdict(self.tiles).values())
        return (
            f"{self.impl}_b{self.batch_size}_n{self.seq_len}_h{self.num_heads}_e{self.emb_dim}"
            f"_{'causal' if self.causal else 'full'}_{self.dtype}{tiles}.json"
        )


def flops(cfg: BenchConfig, mode: str) -> float:
    """FlashAttention's convention: forward 4·b·h·N²·d (half when causal), backward 2.5×, both 3.5×."""
    f = 4 * cfg.batch_size * cfg.num_heads * cfg.seq_len**2 * cfg.head_dim / (2 if cfg.causal else 1)
    return {"forward": f, "backward": 2.5 * f, "forward_backward": 3.5 * f}[mode]


# ---------------------------------------------------------------------------------------
# Runners: each prepares inputs for one configuration and exposes forward, backward,
# forward_backward, a timer and a peak-memory probe.
# ---------------------------------------------------------------------------------------


class KernelRunner:
    """The Numba kernels through kernels.attention / attention_backward on device arrays.

    Outputs come from the caching memory manager (`install_memory_manager`): after the
    warm-up every allocation inside a timed call is a cache hit, so no timed call pays
    for cuMemAlloc or cuMemFree.
    """

    def __init__(self, cfg: BenchConfig, seed: int = 0):
        from numba import cuda

        self.cuda = cuda
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        shape = (cfg.batch_size, cfg.num_heads, cfg.seq_len, cfg.head_dim)
        bf16 = cfg.dtype == "bfloat16"  # numpy has none: bit patterns, and the API told by name
        self.options = dict(impl=cfg.impl, causal=cfg.causal, config=cfg.tiles, dtype="bfloat16" if bf16 else None)
        self.q, self.k, self.v, self.dout = (
            cuda.to_device(kernels.to_bfloat16(x) if bf16 else x.astype(cfg.dtype))
            for x in (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
        )
        self.saved = None  # forward outputs that the timed backward calls take as inputs

    def describe(self) -> dict:
        """The tilings the host API launches with, forward and backward."""
        d = self.cfg.head_dim
        return {
            direction: repr(kernels.resolve_config(self.cfg.impl, d, direction == "backward", self.cfg.tiles))
            for direction in ("forward", "backward")
        }

    def _forward(self):
        return kernels.attention(self.q, self.k, self.v, **self.options)

    def _backward(self, saved):
        return kernels.attention_backward(self.q, self.k, self.v, saved.out, saved.lse, self.dout, **self.options)

    def setup(self, mode: str) -> tuple:
        """Untimed preparation of one timed call: the backward pass takes forward outputs."""
        if mode == "backward":
            if self.saved is None:
                self.saved = self._forward()
            return (self.saved,)
        return ()

    def call(self, mode: str, *state) -> None:
        if mode == "forward":
            self._forward()
        elif mode == "backward":
            self._backward(*state)
        else:
            self._backward(self._forward())

    def release(self) -> None:
        """Drop everything but the inputs, so the forward+backward peak counts that pass alone."""
        self.saved = None
        manager = _memory_manager()
        if manager is not None:
            manager.empty_cache()

    def sync(self) -> None:
        self.cuda.synchronize()

    def time_ms(self, fn) -> float:
        """One run of fn, in milliseconds: CUDA events on a GPU, the host clock under the simulator."""
        if simulator_enabled():
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        start, end = self.cuda.event(timing=True), self.cuda.event(timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return self.cuda.event_elapsed_time(start, end)

    def reset_peak(self) -> None:
        manager = _memory_manager()
        if manager is not None:
            manager.reset_peak()

    def peak_mb(self) -> dict:
        manager = _memory_manager()
        if manager is None:
            return {"allocated": None, "reserved": None}
        return {"allocated": manager.peak_in_use / 2**20, "reserved": manager.peak_reserved / 2**20}


# torch-sdpa's backend, pinned per dtype so that the record says which kernel ran: FlashAttention
# (FlashAttention-2 in PyTorch) takes float16/bfloat16 only; for float32 the memory-efficient one.
SDPA_BACKENDS = {"float16": "FLASH_ATTENTION", "bfloat16": "FLASH_ATTENTION", "float32": "EFFICIENT_ATTENTION"}


class TorchRunner:
    """PyTorch eager attention ("torch", TF32 off) or F.scaled_dot_product_attention ("torch-sdpa").

    No autograd graph outlives the call that built it: a timed forward drops its output
    (and with it the saved P), a timed backward consumes a graph built untimed just before,
    and gradients come from torch.autograd.grad, so nothing accumulates in .grad.
    """

    def __init__(self, cfg: BenchConfig, seed: int = 0):
        import torch
        from torch.nn.attention import SDPBackend

        self.torch = torch
        self.cfg = cfg
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.backend = getattr(SDPBackend, SDPA_BACKENDS[cfg.dtype]) if cfg.impl == "torch-sdpa" else None
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dtype = getattr(torch, cfg.dtype)
        shape = (cfg.batch_size, cfg.num_heads, cfg.seq_len, cfg.head_dim)
        self.inputs = tuple(
            torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_() for _ in range(3)
        )
        self.dout = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)

    def describe(self) -> dict:
        if self.backend is None:
            return {"backend": "eager matmul-softmax-matmul", "tf32": False}
        return {"backend": f"scaled_dot_product_attention, SDPBackend.{self.backend.name} only"}

    def _forward(self):
        torch, cfg = self.torch, self.cfg
        q, k, v = self.inputs
        if self.backend is not None:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(self.backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)
        if cfg.causal:  # N_q = N_k here, so top-left and bottom-right alignment agree
            keep = torch.ones(cfg.seq_len, cfg.seq_len, device="cuda", dtype=torch.bool).tril()
            s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    def setup(self, mode: str) -> tuple:
        """Untimed preparation of one timed call: a fresh graph for each timed backward."""
        return (self._forward(),) if mode == "backward" else ()

    def call(self, mode: str, *state) -> None:
        if mode == "forward":
            self._forward()
            return
        out = state[0] if mode == "backward" else self._forward()
        self.torch.autograd.grad(out, self.inputs, self.dout)

    def release(self) -> None:
        self.torch.cuda.empty_cache()

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def time_ms(self, fn) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def kernels_launched(self) -> dict:
        """The CUDA kernels one forward and one backward call launch, by name (torch.profiler).

        For SDPA the names say which kernel ran and with what tiles (FlashAttention-2's template arguments), the
        launch a DRAM prediction of SDPA has to describe (issue 28)."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        launched = {}
        for mode in ("forward", "backward"):
            state = self.setup(mode)
            self.sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                self.call(mode, *state)
                self.sync()
            launched[mode] = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
        return launched

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats()

    def peak_mb(self) -> dict:
        cuda = self.torch.cuda
        return {"allocated": cuda.max_memory_allocated() / 2**20, "reserved": cuda.max_memory_reserved() / 2**20}


def _memory_manager():
    """The CachingMemoryManager of the current CUDA context, if it was installed."""
    if simulator_enabled():
        return None
    from numba import cuda

    manager = cuda.current_context().memory_manager
    return manager if hasattr(manager, "empty_cache") else None


def install_memory_manager() -> None:
    """Make Numba allocate through a size-keyed cache that also records peaks.

    Must run before the first CUDA context is created. A freed block goes back to the
    cache at once (not to Numba's deferred cuMemFree queue, which synchronises when it
    flushes), and the next allocation of its size reuses it, as torch's caching allocator
    does: timed calls make no driver allocation. The peaks count what the process holds:
    bytes handed out and not yet returned (``peak_in_use``, the counterpart of
    torch.cuda.max_memory_allocated) and bytes taken from the driver (``peak_reserved``).
    """
    if simulator_enabled():
        return
    import weakref
    from collections import defaultdict

    from numba import cuda
    from numba.cuda.cudadrv.driver import AutoFreePointer, CudaAPIError, NumbaCUDAMemoryManager, driver

    class CachingMemoryManager(NumbaCUDAMemoryManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.cache = defaultdict(list)  # size in bytes -> free device pointers of that size
            self.in_use = self.reserved = self.peak_in_use = self.peak_reserved = 0

        def _fresh(self, size):
            """A new block from the driver; when it is out of memory, free the cache and try once more."""
            try:
                return self._attempt_allocation(lambda: driver.cuMemAlloc(size))
            except CudaAPIError:
                if not any(self.cache.values()):
                    raise
                self.empty_cache()
                return self._attempt_allocation(lambda: driver.cuMemAlloc(size))

        def memalloc(self, size):
            cached = self.cache[size]
            if cached:
                ptr = cached.pop()
            else:
                ptr = self._fresh(size)
                self.reserved += size
            self.in_use += size
            self.peak_in_use = max(self.peak_in_use, self.in_use)
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            allocations, cache, manager = self.allocations, self.cache, weakref.ref(self)

            def give_back():  # the block's last reference is gone: back to the cache, not to the driver
                allocations.pop(ptr, None)
                cache[size].append(ptr)
                owner = manager()
                if owner is not None:
                    owner.in_use -= size

            mem = AutoFreePointer(weakref.proxy(self.context), ptr, size, finalizer=give_back)
            allocations[ptr] = mem  # the strong reference; OwnedPointer holds a proxy, as in Numba's manager
            return mem.own()

        def empty_cache(self) -> None:
            """Free every cached block and the blocks in Numba's deferred queue."""
            self.deallocations.clear()
            for size, ptrs in self.cache.items():
                for ptr in ptrs:
                    driver.cuMemFree(ptr)
                self.reserved -= size * len(ptrs)
            self.cache.clear()

        def reset_peak(self) -> None:
            self.peak_in_use, self.peak_reserved = self.in_use, self.reserved

        def reset(self):
            self.cache.clear()
            self.in_use = self.reserved = 0
            super().reset()

    cuda.set_memory_manager(CachingMemoryManager)


def available_impls() -> list[str]:
    """Kernel impls with a backward pass always; the torch ones only where PyTorch with CUDA is importable."""
    names = list(BACKWARD_IMPLS)
    try:
        import torch

        if torch.cuda.is_available() and not simulator_enabled():
            names += list(TORCH_IMPLS)
    except ImportError:
        pass
    return names


def empty_record() -> dict:
    """Seed 002's keys, every value null until measured."""
    record = {mode: {"time(s)": None, "FLOPS(TFLOPs/s)": None} for mode in MODES}
    record["peak_memory_usage(MB)"] = None
    record["peak_memory_reserved(MB)"] = None
    return record


def measure(cfg: BenchConfig, warmup: int, repeats: int, record: dict) -> None:
    """Fill `record` with the median time of each mode and the forward+backward peak memory.

    Each mode's numbers land in `record` as soon as they are measured, so a failure in a
    later mode (out of memory in the backward, say) keeps the earlier ones. Each timed call
    is prepared untimed (`setup`); before the forward+backward runs every buffer but the
    inputs is released, so its peak is that pass's own.
    """
    runner = (TorchRunner if cfg.impl in TORCH_IMPLS else KernelRunner)(cfg)
    try:
        record["implementation"] = runner.describe()
        for mode in MODES:
            if mode == "forward_backward":
                runner.release()
            for _ in range(warmup):
                runner.call(mode, *runner.setup(mode))
            runner.sync()
            if mode == "forward_backward":
                runner.reset_peak()
            times = []
            for _ in range(repeats):
                state = runner.setup(mode)
                runner.sync()
                times.append(runner.time_ms(lambda: runner.call(mode, *state)))
                state = None  # free the inputs before the next setup
            seconds = statistics.median(times) / 1e3
            record[mode] = {
                "time(s)": seconds,
                "FLOPS(TFLOPs/s)": flops(cfg, mode) / seconds / 1e12 if seconds > 0 else None,
            }
        peak = runner.peak_mb()
        record["peak_memory_usage(MB)"] = peak["allocated"]
        record["peak_memory_reserved(MB)"] = peak["reserved"]
        if cfg.impl == "torch-sdpa":
            record["kernels_launched"] = runner.kernels_launched()
    finally:
        runner.release()
        runner = None  # drop the last reference, as `del runner` did


def free_device_memory() -> None:
    """Give cached device memory back after a configuration, so the next one starts clean."""
    gc.collect()
    manager = _memory_manager()
    if manager is not None:
        manager.empty_cache()
    if "torch" in sys.modules and not simulator_enabled():
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def git_commit() -> str:
    """IOSIM_GIT_COMMIT where set (a device call names the commit its tree is: the copy's .git, if it has one, may be
    another's), else HEAD's commit."""
    if os.environ.get("IOSIM_GIT_COMMIT"):
        return os.environ["IOSIM_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def metadata(args: argparse.Namespace) -> dict:
    import numba
    from numba import cuda

    meta = {
        "command": (" ".join([Path(sys.executable).name, "-m", "experiments.gpu_bench", *sys.argv[1:]])
                    if args.command is None else args.command),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "simulator": simulator_enabled(),
        "timing": "host wall clock (CUDA simulator: not a GPU time)" if simulator_enabled() else "CUDA events",
        "warmup": args.warmup,
        "repeats": args.repeats,
        "statistic": "median",
        "flops_convention": "forward 4*b*h*N^2*d (/2 causal), backward 2.5x, forward_backward 3.5x",
        "peak_memory": (
            "forward_backward with only q, k, v, dout alive before it: bytes allocated and not yet freed "
            "(caching Numba EMM plugin / torch.cuda.max_memory_allocated); reserved = taken from the driver"
        ),
        "allocation": "kernels: caching allocator, no driver allocation inside a timed call after warm-up",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        from importlib.metadata import version

        meta["numba_cuda"] = version("numba-cuda")
    except Exception:  # noqa: BLE001 - the version is informative only
        meta["numba_cuda"] = "unknown"
    if simulator_enabled():
        meta["device"] = "Numba CUDA simulator"
    else:
        device = cuda.get_current_device()
        meta["device"] = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
        meta["compute_capability"] = list(device.compute_capability)
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        meta["torch"] = None
    return meta


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[16])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--num-heads", type=int, nargs="+", default=[16])
    parser.add_argument("--emb-dim", type=int, nargs="+", default=[1024], help="num_heads · head_dim")
    parser.add_argument("--causal", choices=["false", "true", "both"], default="false")
    parser.add_argument("--impl", nargs="+", default=None, help="default: every available impl")
    parser.add_argument("--dtype", nargs="+", choices=["float32", "float16", "bfloat16"], default=["float32"],
                        help="bfloat16: flash-swapped-tc and torch only (others record the API's refusal)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the JSON files")
    parser.add_argument("--overwrite", action="store_true", help="re-measure configurations already saved")
    parser.add_argument(
        "--tiles", type=int, nargs=4, metavar=("Br", "Bc", "TM", "TN"), default=None,
        help="tile sizes for flash and flash-swapped (both directions; the backward needs Br = Bc)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and tiles, 1 repeat; runs under the simulator")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)  # recorded instead of sys.argv
    return parser


def tiles_for(args: argparse.Namespace, impl: str):
    """The tiling override for impl: the smoke tiles, --tiles for the fused kernels, else None."""
    if args.smoke:
        return SMOKE_TILES.get(impl)
    if args.tiles is not None and impl in ("flash", "flash-swapped"):
        return kernels.TileConfig(*args.tiles)
    return None


def configurations(args: argparse.Namespace) -> list[BenchConfig]:
    impls = args.impl or available_impls()
    unknown = sorted(set(impls) - set(BACKWARD_IMPLS) - set(TORCH_IMPLS))
    if unknown:
        raise ValueError(f"--impl {unknown} not among {sorted(BACKWARD_IMPLS) + list(TORCH_IMPLS)} (this benchmark "
                         f"times forward and backward; forward-only impls are not timed here)")
    causal = {"false": [False], "true": [True], "both": [False, True]}[args.causal]
    configs = []
    for impl in impls:
        for dtype in args.dtype:
            for causal_flag in causal:
                for b in args.batch_size:
                    for h in args.num_heads:
                        for e in args.emb_dim:
                            if e % h:
                                raise ValueError(f"--emb-dim {e} must be divisible by --num-heads {h}")
                            for n in args.seq_len:
                                configs.append(BenchConfig(b, n, h, e, causal_flag, impl, dtype, tiles_for(args, impl)))
    return configs


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every configuration not yet saved under args.out; return the records written."""
    if args.smoke:
        args.batch_size, args.seq_len, args.num_heads, args.emb_dim = [1], [16], [2], [16]
        args.warmup, args.repeats = 0, 1
        args.impl = args.impl or list(BACKWARD_IMPLS)
    configs = configurations(args)
    install_memory_manager()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = metadata(args)
    records = []
    for cfg in configs:
        path = args.out / cfg.file_name()
        if path.exists() and not args.overwrite:
            continue
        record = {
            "parameters": {
                **asdict(cfg),
                "tiles": None if cfg.tiles is None else repr(cfg.tiles),
                "head_dim": cfg.head_dim,
            }
        }
        record.update(empty_record())
        try:
            measure(cfg, args.warmup, args.repeats, record)
        except Exception as exc:  # noqa: BLE001 - a failed configuration (e.g. out of memory) is recorded, not fatal
            record["error"] = f"{type(exc).__name__}: {exc}"
        free_device_memory()
        record["metadata"] = meta
        path.write_text(json.dumps(record, indent=2) + "\n")
        records.append(record)
    return records


def main() -> None:
    args = build_parser().parse_args()
    for record in run(args):
        p = record["parameters"]
        label = f"{p['impl']:>14} b={p['batch_size']} h={p['num_heads']} N={p['seq_len']} d={p['head_dim']} " + (
            "causal" if p["causal"] else "full"
        )
        if "error" in record:
            print(f"{label}: {record['error']}")
        else:
            cells = [
                f"{m} {record[m]['time(s)'] * 1e3:.3f} ms {record[m]['FLOPS(TFLOPs/s)'] or 0:.2f} TFLOP/s"
                for m in MODES
            ]
            peak = record["peak_memory_usage(MB)"]
            print(f"{label}: " + " | ".join(cells) + (f" | peak {peak:.1f} MB" if peak is not None else ""))


if __name__ == "__main__":
    main()
