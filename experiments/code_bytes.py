"""What a kernel reads beyond its tensors: its machine code and constant banks, read from the compiled binary.

Issue 28, item 1: call 1's one-head rows read 10–30 % more than their tensors once, and the grid-stride kernels of the
backward read bytes they have no tensor for (``fill`` writes dQ's accumulator and reads nothing, yet ncu saw 26 KB).
ncu flushes the L2 before each kernel it measures (its default ``--cache-control all``), so a kernel's first
instructions and its constant banks come from DRAM. This script assembles each kernel a GPU call measured, at that
call's commit (``git archive``; the same NVVM and nvJitLink route as ``experiments.kernel_resources``), reads the sm_90
cubin's sections and sets their size beside what ncu read over the L2 model's tensor bytes, kernel by kernel:

- code = every ``.text.*`` section (the kernel and the routines it calls: 64-bit division, the slow path of a
  reciprocal) + every ``.nv.constant*`` section (bank 0: the kernel's parameters; others: the compiler's constants);
- excess = ncu's DRAM bytes read − the L2 model's reads of the kernel's tensors (``experiments/results/gpu/
  l2_call1.json`` for call 1, committed before this script; ``iosim.gpu.dram.kernel_counts`` for call 4, whose kernels
  are this commit's). Nothing is fitted: the prediction is the size of the binary.

The compared launches: every kernel of call 1's one-head rows, call 4's grid-stride kernels (row_dot, fill, the cast:
their tensors read once at any size), and the empty marker kernel ncu_traffic launches before each row. The summary
gives, per kernel, the range of code / excess over its launches.

    pip install -e '.[gpu]'
    python -m experiments.code_bytes [--out experiments/results/code_bytes]
    python -m experiments.code_bytes --predict GRID [GRID ...] --out FILE.json

The first writes OUT.json and OUT.md (commit, versions, command); exits 77 without the toolchain. The second writes
the DRAM reads the model predicts, code included, for an ncu grid's rows (experiments/ncu_traffic.py), kernel by
kernel: the next call's check of the code term (call5-code), committed before it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_DIR = REPO / "experiments" / "results" / "gpu"
CALL1, CALL4 = "d4169c136b7899daa1a511bb655443b9fd712e69", "e06a8b7d50b90aaa9c25dfa06be5e490a5682c1c"
# Each call's kernels, built with that commit's own modules and their arguments' types as its kernels/api.py launched
# them: each snippet defines BUILD, name -> (dispatcher or function, argument types), run on that commit's tree.
BUILDS = {
    CALL1: """
from kernels import flash, flash_swapped, _device as dev
from experiments.kernel_resources import arr, F32, DROPOUT_ARGS as DA, _first_fit
def tiles(module, d, backward):
    return _first_fit(module, module.BACKWARD_TILES if backward else module.FORWARD_TILES, d, backward)
A3, A2 = arr(F32, 3), arr(F32, 2)
BUILD = {"row_dot": (dev.row_dot_kernel, (A3, A3, A2)), "fill": (dev.fill_kernel, (A3, F32))}
for d in (64, 128):
    BUILD[f"flash forward d={d}"] = (flash.forward_kernel(d, tiles(flash, d, False), False, False, False),
                                     (A3,) * 3 + (A3, A2, A2, A3, A2, F32) + DA)
    BUILD[f"flash backward d={d}"] = (flash.backward_kernel(d, tiles(flash, d, True), False, False),
                                      (A3,) * 5 + (A2, A3, A3, A3, F32) + DA)
    BUILD[f"flash-swapped forward d={d}"] = (
        flash_swapped.forward_kernel(d, tiles(flash_swapped, d, False), False, False), (A3,) * 4 + (A2, F32) + DA)
    BUILD[f"flash-swapped backward d={d}"] = (
        flash_swapped.backward_kernel(d, tiles(flash_swapped, d, True), False, False),
        (A3,) * 4 + (A2, A2, A3, A3, A3, F32) + DA)
""",
    CALL4: """
from kernels import _device as dev
from experiments.kernel_resources import arr, F32, F16
BUILD = {"row_dot": (dev.row_dot_kernel, (arr(F32, 3), arr(F32, 3), arr(F32, 2))),
         "row_dot fp16": (dev.row_dot_kernel, (arr(F16, 3), arr(F16, 3), arr(F32, 2))),
         "fill": (dev.fill_kernel, (arr(F32, 3), F32)), "cast": (dev.cast_kernel, (arr(F32, 3), arr(F16, 3)))}
""",
}
# call 1's kernels as ncu named them (the module and function before Numba's specialisation): the first word of
# their BUILDS name
CALL1_KERNELS = {"flash::kernel": "flash", "flash_swapped::kernel": "flash-swapped",
                 "_device::row_dot_kernel": "row_dot", "_device::fill_kernel": "fill"}
# the grid-stride kernels as ncu names them (Numba's qualified name, before its specialisation in brackets)
KERNEL_NAMES = {"row_dot_kernel_for::row_dot": "row_dot", "_device::fill_kernel": "fill",
                "convert_kernel_for::cast": "cast"}
# ncu_traffic's marker, launched before every row (its body is empty at both commits)
MARKER = """
def ncu_config_marker():
    pass
BUILD["marker"] = (ncu_config_marker, ())
"""


def worker(tree: str) -> None:
    """In a fresh interpreter on a call's tree: compile its BUILD (stdin) to PTX with that tree's own compiler route,
    and print each kernel's PTX as JSON (PTX does not depend on the tree; the caller assembles it)."""
    sys.path.insert(0, tree)
    from numba import cuda

    from experiments import kernel_resources as resources

    scope: dict = {}
    exec(sys.stdin.read(), scope)
    out = {}
    for name, (kernel, signature) in scope["BUILD"].items():
        jitted = kernel if hasattr(kernel, "py_func") else cuda.jit(kernel)
        out[name] = resources.compile_ptx(resources.KernelCase(name, jitted, signature, 1, None))
    print(json.dumps(out))


def assemble(commit: str) -> dict[str, dict[str, int]]:
    """Each kernel of BUILDS[commit] (and the marker) compiled on that commit's tree and assembled for sm_90: its code
    (``experiments.kernel_resources.code_sizes``)."""
    from experiments import kernel_resources as resources

    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "archive", commit, "iosim", "kernels", "experiments"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        done = subprocess.run([sys.executable, __file__, "--worker", tree], input=BUILDS[commit] + MARKER,
                              capture_output=True, text=True, env=env, cwd=tree)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {commit[:7]}'s kernels failed:\n{done.stderr[-3000:]}")
        ptx = json.loads(done.stdout.splitlines()[-1])
    return {name: resources.code_sizes(resources.assemble(text)[1]) for name, text in ptx.items()}


def call1_rows(code: dict[str, dict]) -> list[dict]:
    """Call 1's one-head rows, kernel by kernel, against l2_call1.json's tensor reads (committed before this)."""
    rows = json.loads((GPU_DIR / "l2_call1.json").read_text())["rows"]
    out = []
    for r in rows:
        if r["batch"] * r["heads"] != 1:
            continue
        names = ([f"{r['impl']} forward d={r['d']}"] if r["direction"] == "forward" else
                 [f"{r['impl']} backward d={r['d']}"] if r["impl"] == "flash" else
                 ["row_dot", "fill", f"flash-swapped backward d={r['d']}"])
        predicted = r["predicted"]["effective"]["per_kernel"]
        ran = [CALL1_KERNELS[k.split("[")[0]] for k in r["measured"]["kernels"]]
        if [n.split()[0] for n in names] != ran:
            raise ValueError(f"call 1's row {r['impl']} {r['direction']} N={r['n_q']} ran {ran}, not {names}")
        for name, measured, tensors in zip(names, r["measured"]["per_kernel"], predicted, strict=True):
            out.append(row("call 1", CALL1, r, name, measured["read_bytes"], tensors["reads"], code[name]))
    return out


def tensors_and_code(cfg) -> list[tuple[int, int | None]]:
    """Each kernel of an ncu row's pass, in launch order: the L2 model's tensor reads at the H100 preset's effective L2
    (lockstep) and its code as the model counts it (None where its build's was not read)."""
    from experiments import predict_next_call
    from iosim.gpu.dram import kernel_counts
    from iosim.gpu.hardware import hardware
    from iosim.gpu.kernels import KERNELS

    launch, kernel = predict_next_call.launch(cfg), KERNELS[cfg.impl]
    parts = kernel_counts(kernel, launch, hardware("h100"), budget_s=None)
    return [(p.reads, g.code_bytes) for p, g in zip(parts, kernel.grids(kernel.own(launch)), strict=True)]


def call4_launches(folder: str):
    """Each kernel call 4 measured in ``folder`` (under its results), with the L2 model's tensor reads and code of
    it (this commit's descriptions): (the row's configuration, ncu's kernel name, its DRAM read, the tensors' reads,
    the grid's code bytes)."""
    from experiments import ncu_traffic

    path = GPU_DIR / "call4" / folder
    configs = json.loads((path / "configs.json").read_text())
    for measured in ncu_traffic.measured_rows(path):
        cfg = configs[measured["index"]]
        predicted = tensors_and_code(ncu_traffic.LaunchConfig.from_record(cfg))
        for name, m, (tensors, code) in zip(measured["kernels"], measured["per_kernel"], predicted, strict=True):
            yield cfg, name, m["read_bytes"], tensors, code


def call4_rows(code: dict[str, dict]) -> list[dict]:
    """Call 4's grid-stride kernels (row_dot, fill, cast: their tensors read once at any size), against the L2
    model's tensor reads of this commit (call 4's kernels: kernels/ is unchanged since but for tracing), with their
    code as compiled at call 4's commit."""
    out = []
    for cfg, kernel_name, measured, tensors, _ in call4_launches("rest-first/ncu-short-rest"):
        name = KERNEL_NAMES.get(kernel_name.split("[")[0])
        if name is None:
            continue
        name = "row_dot fp16" if name == "row_dot" and cfg["dtype"] != "float32" else name
        out.append(row("call 4", CALL4, cfg, name, measured, tensors, code[name]))
    return out


def call4_sdpa_rows() -> list[dict]:
    """Call 4's SDPA kernels, with the code the model counts for them: torch 2.14.1's sm_90 binary
    (iosim/gpu/sdpa_resources_sm90.json; call 4 ran torch 2.11.0, whose binary was not read)."""
    out = []
    for cfg, kernel_name, measured, tensors, code in call4_launches("rest-second/ncu-call3-sdpa"):
        name = kernel_name.split("pytorch_flash::")[1].split("<")[0]
        out.append(row("call 4", CALL4, cfg, name, measured, tensors,
                       {"text_bytes": None, "constant_bytes": None, "code_bytes": code}))
    return out


def row(call: str, commit: str, cfg: dict, name: str, measured: float, tensors: int, code: dict) -> dict:
    excess = measured - tensors
    return {"call": call, "commit": commit, "kernel": name, "impl": cfg["impl"], "direction": cfg["direction"],
            "batch_heads": cfg["batch"] * cfg["heads"], "N": cfg["n_q"], "d": cfg["d"], "dtype": cfg["dtype"],
            "measured_read": measured, "tensor_read_predicted": tensors, "excess": excess, **code,
            "code_over_excess": code["code_bytes"] / excess if excess > 0 else None}  # None: the model reads more


def marker_rows(code: dict[str, dict], commit: str, folder: Path, call: str) -> list[dict]:
    """The marker kernel before each row: one thread, no tensors."""
    from experiments.ncu_traffic import marker_reads

    reads = marker_reads(folder)
    return [{"call": call, "commit": commit, "kernel": "marker", "markers": len(reads), "measured_read_min": min(reads),
             "measured_read_max": max(reads), **code["marker"]}]


def predict(grids: list[str]) -> dict:
    """Each row of ``grids`` (experiments/ncu_traffic.py), kernel by kernel as ncu measures them: the L2 model's
    tensor reads at the H100 preset's effective L2 (lockstep), the kernel's code as the model counts it, and their
    sum, the DRAM bytes it predicts ncu reads."""
    from dataclasses import asdict

    from experiments import ncu_traffic

    rows = []
    for grid, index, cfg in [(g, i, c) for g in grids for i, c in enumerate(ncu_traffic.GRIDS[g]())]:
        predicted = tensors_and_code(cfg)
        if any(code is None for _, code in predicted):
            raise ValueError(f"{grid} #{index} ({cfg}): a kernel whose build's code was not read; predict the rows of "
                             f"builds the resource reports hold")
        kernels = [{"tensors": {"reads": tensors}, "code": {"reads": code}, "reads": tensors + code}
                   for tensors, code in predicted]
        reads = sum(k["reads"] for k in kernels)
        rows.append({"grid": grid, "index": index, **asdict(cfg), "tiling": cfg.tile(),
                     "predicted": {"reads": reads, "kernels": kernels},
                     "code_share": sum(k["code"]["reads"] for k in kernels) / reads})
    return {"grids": grids, "gpu": "h100", "schedule": "lockstep", "rows": rows}


def summary(rows: list[dict]) -> list[dict]:
    """Per kernel (its head dimension aside), over its launches: how many, and the least and most code / excess."""
    kinds: dict[str, list[float | None]] = {}
    for r in rows:
        kinds.setdefault(r["kernel"].split(" d=")[0], []).append(r["code_over_excess"])
    return [{"kernel": k, "launches": len(v), "least": min(x for x in v if x is not None),
             "most": max(x for x in v if x is not None), "over_predicted": v.count(None)} for k, v in kinds.items()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "code_bytes"))
    parser.add_argument("--predict", metavar="GRID", nargs="+", help="write the DRAM reads, code included, the model "
                        "predicts for ncu grids' rows (--out names the JSON file) instead of the comparison with calls "
                        "1 and 4")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return {}
    if args.predict:
        from experiments import kernel_resources as resources

        found = {"command": f"python -m experiments.code_bytes --predict {' '.join(args.predict)}",
                 "git_commit": resources.git_commit(), **predict(args.predict)}
        Path(args.out).write_text(json.dumps(found, indent=1) + "\n")
        for r in found["rows"]:
            print(f"{r['impl']} {r['direction']} {r['dtype']} {r['batch'] * r['heads']}×{r['n_k']} d={r['d']}: "
                  f"{r['predicted']['reads']:,} B read, {r['code_share']:.1%} of it code")
        return found
    from experiments import kernel_resources as resources

    resources.require_toolchain()
    code = {commit: assemble(commit) for commit in BUILDS}
    rows = call1_rows(code[CALL1]) + call4_rows(code[CALL4]) + call4_sdpa_rows()
    markers = (marker_rows(code[CALL1], CALL1, GPU_DIR / "call1" / "ncu", "call 1")
               + marker_rows(code[CALL4], CALL4, GPU_DIR / "call4" / "rest-first" / "ncu-short-rest", "call 4"))
    report = {"command": "python -m experiments.code_bytes", "git_commit": resources.git_commit(),
              "versions": resources.versions(), "rows": rows, "summary": summary(rows), "markers": markers,
              "code": {commit[:7]: found for commit, found in code.items()}}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return report


def code_cell(r: dict) -> str:
    """Code bytes, with text + constants where the cubin was read here."""
    split = f" ({r['text_bytes']:,} + {r['constant_bytes']:,})" if r["text_bytes"] is not None else ""
    return f"{r['code_bytes']:,}{split}"


def markdown(report: dict) -> str:
    lines = ["# What the kernels read beyond their tensors: code and constant banks (sm_90 cubins)", "",
             f"- command: `{report['command']}`", f"- git commit: `{report['git_commit']}`",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
             "- code = the cubin's `.text.*` + `.nv.constant*` sections, each of iosim's kernels built at the commit "
             "its call ran; SDPA's: its kernel's `.text` + constant bank 0 in torch 2.14.1's binary, as the model "
             "counts it (call 4 ran torch 2.11.0); excess = ncu's DRAM read − the L2 model's tensor reads", "",
             "| call | kernel | impl | direction | batch·heads | N | d | measured read | tensors predicted | excess | "
             "code (text + constants) | code / excess |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["rows"]:
        ratio = "—" if r["code_over_excess"] is None else f"{r['code_over_excess']:.2f}"
        lines.append(f"| {r['call']} | {r['kernel']} | {r['impl']} | {r['direction']} | {r['batch_heads']} | "
                     f"{r['N']:,} | {r['d']} | {r['measured_read']:,.0f} | {r['tensor_read_predicted']:,} | "
                     f"{r['excess']:,.0f} | {code_cell(r)} | {ratio} |")
    lines += ["", "| kernel | launches | code / excess |", "| --- | ---: | --- |"]
    lines += [f"| {k['kernel']} | {k['launches']} | {k['least']:.2f} to {k['most']:.2f}"
              + (f" ({k['over_predicted']} where the model's tensors read more)" if k["over_predicted"] else "") + " |"
              for k in report["summary"]]
    lines += ["", "| call | marker kernels | measured read | code (text + constants) |", "| --- | ---: | ---: | ---: |"]
    for m in report["markers"]:
        lines.append(f"| {m['call']} | {m['markers']} | {m['measured_read_min']:,.0f} to {m['measured_read_max']:,.0f}"
                     f" | {code_cell(m)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
