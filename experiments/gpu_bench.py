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

Implementations: the kernels (kernels.IMPLS), and where PyTorch is installed "torch"
(eager matmul-softmax-matmul, TF32 off) and "torch-sdpa" (F.scaled_dot_product_attention).

    python experiments/gpu_bench.py --impl flash-swapped torch --seq-len 1024 2048 4096 \\
        --batch-size 16 --num-heads 16 --emb-dim 1024
    python experiments/plot_gpu_bench.py experiments/results/kernels_bench

--smoke runs tiny sizes through every kernel impl; it also runs under Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1), where times are host wall-clock and meaningless.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import kernels  # noqa: E402
from kernels._device import simulator_enabled  # noqa: E402

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
    """The Numba kernels through kernels.attention / attention_backward on device arrays."""

    def __init__(self, cfg: BenchConfig, seed: int = 0):
        from numba import cuda

        self.cuda = cuda
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        shape = (cfg.batch_size, cfg.num_heads, cfg.seq_len, cfg.head_dim)
        self.q, self.k, self.v, self.dout = (
            cuda.to_device(rng.standard_normal(shape, dtype=np.float32).astype(cfg.dtype)) for _ in range(4)
        )
        self.saved = self.forward()
        self.sync()

    def forward(self):
        cfg = self.cfg
        return kernels.attention(self.q, self.k, self.v, impl=cfg.impl, causal=cfg.causal, config=cfg.tiles)

    def backward(self, saved=None):
        cfg, saved = self.cfg, saved or self.saved
        return kernels.attention_backward(
            self.q, self.k, self.v, saved.out, saved.lse, self.dout, impl=cfg.impl, causal=cfg.causal, config=cfg.tiles
        )

    def forward_backward(self):
        return self.backward(self.forward())

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
        manager = _peak_tracker()
        if manager is not None:
            manager.reset_peak()

    def peak_mb(self) -> float | None:
        manager = _peak_tracker()
        return None if manager is None else manager.peak / 2**20


class TorchRunner:
    """PyTorch eager attention ("torch", TF32 off) or F.scaled_dot_product_attention ("torch-sdpa")."""

    def __init__(self, cfg: BenchConfig, seed: int = 0):
        import torch

        self.torch = torch
        self.cfg = cfg
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dtype = getattr(torch, cfg.dtype)
        shape = (cfg.batch_size, cfg.num_heads, cfg.seq_len, cfg.head_dim)
        self.q, self.k, self.v = (
            torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_() for _ in range(3)
        )
        self.dout = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
        self.saved = self.forward()

    def forward(self):
        torch, cfg = self.torch, self.cfg
        if cfg.impl == "torch-sdpa":
            return torch.nn.functional.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=cfg.causal)
        s = (self.q @ self.k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)
        if cfg.causal:  # N_q = N_k here, so top-left and bottom-right alignment agree
            keep = torch.ones(cfg.seq_len, cfg.seq_len, device="cuda", dtype=torch.bool).tril()
            s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ self.v

    def backward(self):
        self.saved.backward(self.dout, retain_graph=True)

    def forward_backward(self):
        self.forward().backward(self.dout)

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

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats()

    def peak_mb(self) -> float:
        return self.torch.cuda.max_memory_allocated() / 2**20


def _peak_tracker():
    """The PeakTrackingMemoryManager of the current CUDA context, if it was installed."""
    if simulator_enabled():
        return None
    from numba import cuda

    manager = cuda.current_context().memory_manager
    return manager if hasattr(manager, "reset_peak") else None


def install_peak_tracker() -> None:
    """Make Numba allocate through a manager that records the peak of live device bytes.

    Must run before the first CUDA context is created. Numba's own allocator is kept;
    only the bookkeeping is added (the counterpart of torch.cuda.max_memory_allocated).
    """
    if simulator_enabled():
        return
    from numba import cuda
    from numba.cuda.cudadrv.driver import NumbaCUDAMemoryManager

    class PeakTrackingMemoryManager(NumbaCUDAMemoryManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.peak = 0

        def live_bytes(self) -> int:
            return sum(mem.size for mem in list(self.allocations.values()))

        def memalloc(self, size):
            mem = super().memalloc(size)
            self.peak = max(self.peak, self.live_bytes())
            return mem

        def reset_peak(self) -> None:
            self.peak = self.live_bytes()

    cuda.set_memory_manager(PeakTrackingMemoryManager)


def available_impls() -> list[str]:
    """Kernel impls always; the torch ones only where PyTorch with CUDA is importable."""
    names = list(kernels.IMPLS)
    try:
        import torch

        if torch.cuda.is_available() and not simulator_enabled():
            names += list(TORCH_IMPLS)
    except ImportError:
        pass
    return names


def measure(cfg: BenchConfig, warmup: int, repeats: int) -> dict:
    """Median time of each mode and the peak memory of forward+backward, for one configuration."""
    runner = (TorchRunner if cfg.impl in TORCH_IMPLS else KernelRunner)(cfg)
    result = {}
    for mode in MODES:
        fn = getattr(runner, mode)
        for _ in range(warmup):
            fn()
        runner.sync()
        if mode == "forward_backward":
            runner.reset_peak()
        times = [runner.time_ms(fn) for _ in range(repeats)]
        seconds = statistics.median(times) / 1e3
        result[mode] = {"time(s)": seconds, "FLOPS(TFLOPs/s)": flops(cfg, mode) / seconds / 1e12 if seconds > 0 else None}
    result["peak_memory_usage(MB)"] = runner.peak_mb()
    return result


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def metadata(args: argparse.Namespace) -> dict:
    import numba
    from numba import cuda

    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if args.command is None else args.command,
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
        "peak_memory": "live device bytes during forward_backward (Numba EMM plugin / torch.cuda.max_memory_allocated)",
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
    parser.add_argument("--dtype", nargs="+", choices=["float32", "float16"], default=["float32"])
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
    unknown = sorted(set(impls) - set(kernels.IMPLS) - set(TORCH_IMPLS))
    if unknown:
        raise ValueError(f"--impl {unknown} not among {sorted(kernels.IMPLS) + list(TORCH_IMPLS)}")
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
        args.impl = args.impl or list(kernels.IMPLS)
    configs = configurations(args)
    install_peak_tracker()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = metadata(args)
    records = []
    for cfg in configs:
        path = args.out / cfg.file_name()
        if path.exists() and not args.overwrite:
            continue
        record = {"parameters": {**asdict(cfg), "tiles": None if cfg.tiles is None else repr(cfg.tiles), "head_dim": cfg.head_dim}}
        try:
            record.update(measure(cfg, args.warmup, args.repeats))
        except Exception as exc:  # noqa: BLE001 - a failed configuration (e.g. out of memory) is recorded, not fatal
            record["error"] = f"{type(exc).__name__}: {exc}"
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
            cells = [f"{m} {record[m]['time(s)'] * 1e3:.3f} ms {record[m]['FLOPS(TFLOPs/s)'] or 0:.2f} TFLOP/s" for m in MODES]
            print(f"{label}: " + " | ".join(cells) + f" | peak {record['peak_memory_usage(MB)']} MB")


if __name__ == "__main__":
    main()
