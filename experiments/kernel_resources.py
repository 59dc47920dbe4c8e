"""Compiler resource report of every kernel for sm_90 (H100/H200), made without a GPU.

Each kernel is compiled by numba-cuda (NVVM) to PTX for compute capability 9.0 with the
argument types the host API launches it with, then assembled for sm_90 by nvJitLink,
whose verbose log is ptxas's report: registers per thread, spill stores/loads, stack
frame and static shared memory. Next to it: the shared memory the host-side formula
predicts (the d-too-large check relies on it), threads per block and the occupancy those
numbers allow on an H100 SM (65,536 registers over 4 sub-partitions, 228 KiB shared memory, 2,048 threads, 32
blocks: iosim.gpu.l2.occupancy_limits, the rule the DRAM level bounds every preset by).

    pip install -e '.[test]'      # numba-cuda[cu13]: NVRTC, NVVM and nvJitLink
    python -m experiments.kernel_resources [--out experiments/results/kernels_resources_sm90]
                                           [--json iosim/gpu/kernels_resources_sm90.json] [--jobs N]

Writes OUT.md and the JSON, with the versions, the git commit and the command; the JSON lies in
iosim/gpu/, where iosim.gpu.occupancy reads the blocks per SM from it.

    python -m experiments.kernel_resources --check [--covering] [--jobs N]

compiles and assembles every kernel and writes nothing: it exits with status 1, naming
each kernel that failed, if any did. With --covering it compiles a covering subset (29 of
the 71): of each family whose specialisations vary in dtype, head dim and causal+dropout
(flash-swapped and flash-swapped-tc, forward and backward), two of the eight, all settings
at their first level and all at their second, so that every level of every setting is
compiled at least once; of standard's four matmuls
each once, the two dtypes alternating; of split-kv's split kernel one split count (the
others differ only in that constant), its combine at both d; the sawtooth forward at one d;
flash and the small kernels all.
tests/test_kernels_compile.py runs --check --covering in CI, whose other kernel tests
run under Numba's CUDA simulator, which neither type-checks a kernel nor lowers it to
PTX. Without NVVM or nvJitLink either form exits with status 77 (TOOLCHAIN_MISSING).

Numba compiles device functions for "the current device"; with no GPU present this
script substitutes a stand-in device of compute capability 9.0 while compiling.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import subprocess
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numba
import numba.cuda.dispatcher
from numba import cuda, types

from experiments.elf import elf_sections
from experiments.ncu_traffic import call3_split_kv_grid, call5_code_grid
from iosim.core.gpus import GPUS
from iosim.gpu.l2 import occupancy_limits
from iosim.gpu.occupancy import sm90_bound
from iosim.kernels import _device as dev
from iosim.kernels import flash, flash_swapped, flash_swapped_tc, split_kv, standard

REPO = Path(__file__).resolve().parents[1]
CC = (9, 0)
ARCH = "sm_90"
TOOLCHAIN_MISSING = 77  # exit status without NVVM or nvJitLink: automake's "test skipped"
H100 = GPUS["h100"]
# sm_90 reserves 1 KiB of shared memory per block (iosim.core.gpus.CC_9_0); ptxas counts it in "smem"
SHARED_RESERVED_PER_BLOCK = H100.sm.reserved_per_block

F32, F16, U16, U64, I64 = types.float32, types.float16, types.uint16, types.uint64, types.int64


def arr(dtype, ndim: int):
    return types.Array(dtype, ndim, "C")


DROPOUT_ARGS = (U64, U64, U64, F32)  # seed_lo, seed_hi, threshold, inv_keep
ROW_DOT_SHARED = 4 * dev.ROW_DOT_WARPS * dev.WARP * dev.PADDED_WARP  # row_dot's partial sums (float32)


@dataclass(frozen=True)
class KernelCase:
    """One kernel specialisation to compile, with what the report says about it."""

    name: str
    kernel: object  # a numba CUDA dispatcher
    signature: tuple
    threads: int
    predicted_shared: int | None
    layout: object = None  # the thread block's kernels._register_tiles.Layout, where it has one
    mma_per_step: int | None = None  # tensor-core MMAs a warp issues per K/V step, by construction
    covering: bool = True  # in the covering subset that --check --covering compiles


def each_level_once(*levels: int) -> bool:
    """Whether a specialisation with these 0/1 levels of two-level settings is one of the two that cover every level
    of every setting: all at the first level, (0, 0, 0), or all at the second, (1, 1, 1)."""
    return len(set(levels)) == 1


def cases(d_values=(64, 128)) -> list[KernelCase]:
    out = []
    for dt_level, (dt, dt_name) in enumerate(((F32, "fp32"), (F16, "fp16"))):
        for d_level, d in enumerate(d_values):
            for flags_level, (causal, dropout) in enumerate(((False, False), (True, True))):
                tag = f"d={d} {dt_name}{' causal+dropout' if causal else ''}"
                covering = each_level_once(dt_level, d_level, flags_level)
                c = _first_fit(flash_swapped, flash_swapped.FORWARD_TILES, d, False)
                out.append(KernelCase(
                    f"flash-swapped forward {tag} {c}",
                    flash_swapped.forward_kernel(d, c, causal, dropout),
                    (arr(dt, 1),) * 4 + (arr(F32, 1), I64, I64, I64, F32) + DROPOUT_ARGS,
                    c.threads(), flash_swapped.shared_bytes(c, d, False), flash_swapped.layout(c, d, False),
                    covering=covering,
                ))
                c = _first_fit(flash_swapped, flash_swapped.BACKWARD_TILES, d, True)
                out.append(KernelCase(
                    f"flash-swapped backward {tag} {c}",
                    flash_swapped.backward_kernel(d, c, causal, dropout),
                    (arr(dt, 1),) * 4 + (arr(F32, 1), arr(F32, 1), arr(F32, 1), arr(dt, 1), arr(dt, 1), I64, I64, F32)
                    + DROPOUT_ARGS,
                    c.threads(True), flash_swapped.shared_bytes(c, d, True), flash_swapped.layout(c, d, True),
                    covering=covering,
                ))
                if dt is F16:  # and its bfloat16 twin, whose arrays hold uint16 bit patterns
                    for tc_level, (tc_dt, tc_name, tc_dtype) in enumerate(
                        ((F16, "fp16", "float16"), (U16, "bf16", "bfloat16"))
                    ):
                        qkv = U64 if flash_swapped_tc.paired_words(d) else tc_dt
                        tc_covering = each_level_once(tc_level, d_level, flags_level)
                        out.append(KernelCase(
                            f"flash-swapped-tc forward {tag.replace('fp16', tc_name)} "
                            f"({flash_swapped_tc.WARPS} warps, "
                            f"{flash_swapped_tc.BR}x{flash_swapped_tc.keys_per_step(d)})",
                            flash_swapped_tc.forward_kernel(d, causal, dropout, tc_dtype),
                            (arr(qkv, 1),) * 3 + (arr(tc_dt, 1), arr(F32, 1), I64, I64, F32) + DROPOUT_ARGS,
                            flash_swapped_tc.THREADS, flash_swapped_tc.tc_shared_bytes(d),
                            mma_per_step=flash_swapped_tc.mma_per_step(d), covering=tc_covering,
                        ))
                        out.append(KernelCase(
                            f"flash-swapped-tc backward {tag.replace('fp16', tc_name)} "
                            f"({flash_swapped_tc.WARPS} warps, {flash_swapped_tc.BKB}x"
                            f"{flash_swapped_tc.queries_per_step(d)})",
                            flash_swapped_tc.backward_kernel(d, causal, dropout, tc_dtype),
                            (arr(qkv, 1),) * 4 + (arr(F32, 1),) * 3 + (arr(tc_dt, 1),) * 2 + (I64, I64, F32)
                            + DROPOUT_ARGS,
                            flash_swapped_tc.THREADS, flash_swapped_tc.backward_shared_bytes(
                                d, flash_swapped_tc.queries_per_step(d)),
                            mma_per_step=flash_swapped_tc.backward_mma_per_step(d), covering=tc_covering,
                        ))
        d = 64
        c = _first_fit(flash, flash.FORWARD_TILES, d, False)
        out.append(KernelCase(
            f"flash forward d={d} {dt_name} {c}",
            flash.forward_kernel(d, c, False, False, dt is not F32),
            (arr(dt, 3),) * 3 + (arr(F32, 3), arr(F32, 2), arr(F32, 2), arr(dt, 3), arr(F32, 2), F32) + DROPOUT_ARGS,
            c.threads(), flash.shared_bytes(c, d, False),
        ))
        c = _first_fit(flash, flash.BACKWARD_TILES, d, True)
        out.append(KernelCase(
            f"flash backward d={d} {dt_name} {c}",
            flash.backward_kernel(d, c, False, False),
            (arr(dt, 3),) * 5 + (arr(F32, 2), arr(F32, 3), arr(dt, 3), arr(dt, 3), F32) + DROPOUT_ARGS,
            c.threads(True), flash.shared_bytes(c, d, True),
        ))
        m = standard.MatmulConfig()
        for product, (ta, tb, a_t, b_t, c_t, what) in enumerate((
            (False, True, dt, dt, F32, "S = tau Q K^T"),
            (False, False, F32, dt, dt, "O = P V, dQ = tau dS K"),
            (True, False, F32, dt, dt, "dV = (P Z)^T dO, dK = tau dS^T Q"),
            (False, True, dt, dt, F32, "dP = dO V^T"),
        )):
            out.append(KernelCase(
                f"standard matmul {what} {dt_name} {m}",
                standard.matmul_kernel(ta, tb, m),
                (arr(a_t, 3), arr(b_t, 3), arr(c_t, 3), F32),
                m.threads(), 4 * m.BK * (m.BM + 1 + m.BN + 1), covering=(product + dt_level) % 2 == 0,
            ))
    out += split_kv_cases(d_values)
    for d in d_values:  # the sawtooth order, float16 (call3-sawtooth's kernels); in --covering, the last
        c = _first_fit(flash_swapped, flash_swapped.FORWARD_TILES, d, False)
        out.append(KernelCase(
            f"sawtooth flash-swapped forward d={d} fp16 {c}",
            flash_swapped.forward_kernel(d, c, False, False, sawtooth=True),
            (arr(F16, 1),) * 4 + (arr(F32, 1), I64, I64, I64, F32) + DROPOUT_ARGS,
            c.threads(), flash_swapped.shared_bytes(c, d, False), flash_swapped.layout(c, d, False),
            covering=d == d_values[-1],
        ))
    m = standard.MatmulConfig()
    out += [
        KernelCase("standard softmax (causal+dropout)", standard.softmax_kernel(m.row_threads, True, True),
                   (arr(F32, 3), arr(F32, 2)) + DROPOUT_ARGS, m.row_threads, 2 * 4 * m.row_threads),
        KernelCase("standard probs (backward, causal+dropout)", standard.probs_kernel(True, True),
                   (arr(F32, 3), arr(F32, 2), arr(F32, 3)) + DROPOUT_ARGS, dev.GRID_STRIDE_THREADS, 0),
        KernelCase("standard dS (backward, dropout)", standard.ds_kernel(True),
                   (arr(F32, 3), arr(F32, 3), arr(F32, 2)) + DROPOUT_ARGS, dev.GRID_STRIDE_THREADS, 0),
        KernelCase("D = rowsum(dO o O) fp16", dev.row_dot_kernel, (arr(F16, 3), arr(F16, 3), arr(F32, 2)),
                   dev.GRID_STRIDE_THREADS, ROW_DOT_SHARED),
        KernelCase("D = rowsum(dO o O) fp32", dev.row_dot_kernel, (arr(F32, 3), arr(F32, 3), arr(F32, 2)),
                   dev.GRID_STRIDE_THREADS, ROW_DOT_SHARED),
        KernelCase("fill fp32", dev.fill_kernel, (arr(F32, 3), F32), dev.GRID_STRIDE_THREADS, 0),
        KernelCase("cast fp32 -> fp16", dev.cast_kernel, (arr(F32, 3), arr(F16, 3)), dev.GRID_STRIDE_THREADS, 0),
        KernelCase("D = rowsum(dO o O) bf16 (flash-swapped-tc)", flash_swapped_tc.row_dot_kernel("bfloat16"),
                   (arr(U16, 3), arr(U16, 3), arr(F32, 2)), dev.GRID_STRIDE_THREADS, ROW_DOT_SHARED),
        KernelCase("round fp32 -> bf16 (flash-swapped-tc dQ)", flash_swapped_tc.store_kernel("bfloat16"),
                   (arr(F32, 3), arr(U16, 3)), dev.GRID_STRIDE_THREADS, 0),
    ]
    return out


def split_kv_cases(d_values) -> list[KernelCase]:
    """split-kv's two kernels, float16, at every split count the call3-split-kv and call5-code grids launch (each
    count is a compile-time constant of the split kernel, kernels/split_kv.py); in --covering, one split count and
    the combine."""
    counts = sorted({cfg.splits for cfg in call3_split_kv_grid() + call5_code_grid() if cfg.splits is not None})
    out = []
    for d in d_values:
        c = _first_fit(split_kv, split_kv.FORWARD_TILES, d, False)
        for S in counts:
            partial = F32 if S > 1 else F16  # S > 1 writes float32 partials; one split writes O itself
            out.append(KernelCase(
                f"split-kv split d={d} fp16 S={S} {c}",
                flash_swapped.forward_kernel(d, c, False, False, S, True),
                (arr(F16, 1),) * 3 + (arr(partial, 1), arr(F32, 1), I64, I64, I64, F32) + DROPOUT_ARGS,
                c.threads(), split_kv.shared_bytes(c, d, False), flash_swapped.layout(c, d, False),
                covering=S == counts[len(counts) // 2] and d == d_values[0],
            ))
        out.append(KernelCase(
            f"split-kv combine d={d} fp16 (B_r={c.Br})", split_kv.combine_kernel(d, c.Br),
            (arr(F32, 1), arr(F32, 1), arr(F16, 1), arr(F32, 1), I64, I64), split_kv.COMBINE_THREADS, 0,
        ))
    return out


def _first_fit(module, tiles, d: int, backward: bool):
    for cfg in tiles:
        try:
            module.check_config(cfg, d, backward)
            return cfg
        except ValueError:
            continue
    raise ValueError(f"no tiling of {module.__name__} fits d={d}")


class _StandInSm90:
    """Stands in for the absent GPU when Numba asks the current device's compute capability."""

    compute_capability = CC


def compile_ptx(case: KernelCase) -> str:
    original = numba.cuda.dispatcher.get_current_device
    numba.cuda.dispatcher.get_current_device = _StandInSm90
    try:
        bounds = case.kernel.targetoptions.get("launch_bounds")
        ptx, _ = cuda.compile_ptx(case.kernel.py_func, case.signature, cc=CC, launch_bounds=bounds)
    finally:
        numba.cuda.dispatcher.get_current_device = original
    return ptx


def assemble(ptx: str) -> tuple[str, bytes]:
    """The PTX assembled for sm_90 by nvJitLink: its verbose log (ptxas's resource report) and the cubin."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(2, [f"-arch={ARCH}", "-verbose"])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        try:
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as e:
            buf = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, buf)
            raise RuntimeError(
                f"nvJitLink cannot assemble the PTX for {ARCH}: {e}\n{buf.decode(errors='replace')}"
            ) from e
        buf = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, buf)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return buf.decode(errors="replace"), bytes(cubin)
    finally:
        nvjitlink.destroy(handle)


def code_sizes(cubin: bytes) -> dict[str, int]:
    """What a kernel's cubin holds for the SMs to fetch: its machine code (every ``.text.*`` section: the kernel and
    the routines it calls) and its constant banks (every ``.nv.constant*``: bank 0 holds the parameters), and their
    sum. ncu flushes the L2 before each kernel it measures, so these come from DRAM once per launch
    (experiments/code_bytes.py sets them beside calls 1 and 4)."""
    sections = elf_sections(cubin)
    text = sum(size for name, size in sections.items() if name.startswith(".text."))
    constants = sum(size for name, size in sections.items() if name.startswith(".nv.constant"))
    return {"text_bytes": text, "constant_bytes": constants, "code_bytes": text + constants}


def missing_toolchain() -> str | None:
    """Why NVVM or nvJitLink cannot be loaded, or None when both can."""
    try:
        from cuda.bindings import nvjitlink
        from numba.cuda.cudadrv import nvvm

        nvjitlink.version()
        nvvm.NVVM()
    except (ImportError, OSError, RuntimeError) as e:  # a library that is not found raises a RuntimeError
        return f"{type(e).__name__}: {str(e).strip()}"
    return None


def require_toolchain() -> None:
    """Exit with status TOOLCHAIN_MISSING, saying how to get it, where NVVM or nvJitLink cannot be loaded."""
    missing = missing_toolchain()
    if missing is not None:
        print(f"NVVM or nvJitLink cannot be loaded ({missing}); pip install -e '.[test]' brings both "
              "(numba-cuda[cu13])", file=sys.stderr)
        sys.exit(TOOLCHAIN_MISSING)


def _assemble_case(index: int) -> tuple[tuple[str, bytes] | None, str | None]:
    """((nvJitLink's log, the cubin), None) for cases()[index], or (None, why it failed to compile or assemble).

    A process pool's task: it takes an index, since a case's dispatcher does not pickle.
    """
    try:
        return assemble(compile_ptx(cases()[index])), None
    except Exception as e:  # any failure is a finding about that kernel, reported with its name
        # the message says what failed to type or assemble; the compiler's stack would bury it
        return None, "".join(traceback.format_exception_only(e)).rstrip()


def assemble_all(jobs: int, covering: bool = False):
    """Yield (case, (nvJitLink's log, the cubin) or None, why it failed or None) for every case (or every covering one),
    in order."""
    all_cases = cases()
    chosen = [index for index, case in enumerate(all_cases) if case.covering or not covering]
    if jobs == 1:
        for index in chosen:
            yield all_cases[index], *_assemble_case(index)
        return
    # spawn: fresh interpreters, whatever the platform's default, so no compiler state is forked
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(_assemble_case, index) for index in chosen]
        for case, future in zip((all_cases[index] for index in chosen), futures):
            try:
                log, error = future.result()
            except BrokenProcessPool as e:
                log, error = None, f"a compiling process died while this kernel or one beside it compiled: {e}"
            yield case, log, error
    finally:
        pool.shutdown(cancel_futures=True)


def parse(log: str) -> dict:
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    used = re.search(r"used (\d+) registers.*?(\d+) stack, (\d+) bytes smem", log)
    if not (spills and used):
        raise RuntimeError(f"unrecognised nvJitLink log:\n{log}")
    return {
        "registers": int(used.group(1)),
        "stack_frame_bytes": int(spills.group(1)),
        "spill_store_bytes": int(spills.group(2)),
        "spill_load_bytes": int(spills.group(3)),
        "shared_bytes": int(used.group(3)),
    }


def occupancy(registers: int, shared: int, threads: int) -> dict:
    """Resident blocks per H100 SM (``iosim.gpu.l2.occupancy_limits``, the rule the DRAM level bounds each preset by),
    the resource that sets them (the first of registers, shared memory, threads and the block limit where two tie)
    and the fraction of the SM's warps they fill."""
    b = sm90_bound(shared, threads, registers)  # ptxas's smem holds the 1 KiB per-block reserve: taken out
    limits = occupancy_limits(H100, b.block_bytes, b.threads, b.registers)
    blocks = min(limits.values())
    bound = min(("registers", "shared memory", "threads", "blocks"), key=lambda k: limits.get(k, math.inf))
    return {"blocks_per_sm": blocks, "limited_by": bound,
            "warp_occupancy": blocks * math.ceil(threads / 32) / (H100.sm.threads // 32)}


def versions() -> dict:
    from importlib.metadata import version

    from cuda.bindings import nvjitlink
    from numba.cuda.cudadrv import nvvm

    return {
        "numba": numba.__version__,
        "numba-cuda": version("numba-cuda"),
        "nvvm": ".".join(map(str, nvvm.NVVM().get_version())),
        "nvjitlink": ".".join(map(str, nvjitlink.version())),
        "python": sys.version.split()[0],
    }


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(report: dict) -> str:
    lines = [
        f"# Kernel resources for {ARCH} (compiled without a GPU)",
        "",
        f"- command: `{report['command']}`",
        f"- git commit: `{report['git_commit']}`",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "- smem is ptxas's static shared memory, which includes sm_90's 1 KiB per-block reserve; "
        "predicted = kernels' shared_bytes() formula + 1 KiB",
        "- occupancy: resident blocks per H100 SM from registers, shared memory and threads",
        "- code: the cubin's machine code (.text) + constant banks (.nv.constant), read from DRAM once per launch "
        "from a cold L2",
        "",
        "| kernel | threads | registers | spill st/ld (B) | stack (B) | smem (B) | predicted smem (B) "
        "| blocks/SM (limit) | warp occupancy | code (B) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in report["kernels"]:
        lines.append(
            f"| {k['kernel']} | {k['threads']} | {k['registers']} | {k['spill_store_bytes']}/{k['spill_load_bytes']} | "
            f"{k['stack_frame_bytes']} | {k['shared_bytes']} | {k['predicted_shared_bytes']} | "
            f"{k['blocks_per_sm']} ({k['limited_by']}) | {k['warp_occupancy']:.0%} | {k['code_bytes']:,} |"
        )
    return "\n".join(lines) + "\n"


def check(jobs: int, covering: bool = False) -> int:
    """Compile and assemble every case (or the covering subset); print each failure with its kernel's name.
    The exit status."""
    failed = []
    n = 0
    for n, (case, _, error) in enumerate(assemble_all(jobs, covering), 1):
        if error is None:
            print(f"ok      {case.name}", flush=True)
        else:
            failed.append(case.name)
            print(f"FAILED  {case.name}\n{error}", flush=True)
    if failed:
        print(f"{len(failed)} of {n} kernel specialisations do not compile for {ARCH}:", *failed, sep="\n  ")
        return 1
    print(f"all {n} kernel specialisations compile for {ARCH} (NVVM to PTX, nvJitLink to a cubin)")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "kernels_resources_sm90")
    parser.add_argument("--json", type=Path, default=REPO / "iosim" / "gpu" / "kernels_resources_sm90.json",
                        help="the JSON report (default: where iosim.gpu.occupancy reads it)")
    parser.add_argument("--check", action="store_true",
                        help="compile and assemble every kernel, write no report; exit 1 naming those that fail")
    parser.add_argument("--covering", action="store_true",
                        help="with --check: compile the covering subset only (every level of every setting once)")
    parser.add_argument("--jobs", type=int, default=1, help="kernels compiled in parallel processes (default 1)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be at least 1")
    if args.covering and not args.check:
        parser.error("--covering goes with --check: the report covers every kernel")
    if numba.config.ENABLE_CUDASIM:
        parser.error("NUMBA_ENABLE_CUDASIM=1 selects Numba's CUDA simulator, which compiles nothing; unset it")
    require_toolchain()
    if args.check:
        sys.exit(check(args.jobs, args.covering))
    rows = []
    for case, built, error in assemble_all(args.jobs):
        if error is not None:
            sys.exit(f"{case.name} does not compile for {ARCH}:\n{error}")
        log, cubin = built
        row = {"kernel": case.name, "threads": case.threads, **parse(log), **code_sizes(cubin)}
        row["predicted_shared_bytes"] = case.predicted_shared + (
            SHARED_RESERVED_PER_BLOCK if case.predicted_shared else 0
        )
        row.update(occupancy(row["registers"], row["shared_bytes"], case.threads))
        rows.append(row)
        print(f"{case.name}: {row['registers']} regs, spills {row['spill_store_bytes']}/{row['spill_load_bytes']} B, "
              f"smem {row['shared_bytes']} B, code {row['code_bytes']} B")
    write_report(args.out, {"versions": versions(), "kernels": rows}, markdown, args.json)


def command_line() -> str:
    """This process's command as run from the repository root: ``python -m experiments.NAME ARGS``."""
    spec = sys.modules["__main__"].__spec__  # None when run as a file
    program = f"-m {spec.name}" if spec is not None else Path(sys.argv[0]).as_posix()
    return " ".join(["python", program, *sys.argv[1:]])


def write_report(out: Path, fields: dict, to_markdown, json_path: Path | None = None) -> None:
    """OUT.md and the JSON (OUT.json unless `json_path`) of a report on the kernels for ARCH: `fields` with the
    architecture, command and commit."""
    report = {
        "arch": ARCH,
        "command": command_line(),
        "git_commit": git_commit(),
        **fields,
    }
    json_path = out.with_suffix(".json") if json_path is None else json_path
    for path in (out, json_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(to_markdown(report))


if __name__ == "__main__":
    main()
