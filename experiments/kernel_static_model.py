"""Static performance model of the kernels on sm_90, made without a GPU.

Each kernel is compiled as experiments.kernel_resources compiles it (numba-cuda to
PTX, nvJitLink to an sm_90 cubin, ptxas's resource report), the cubin is disassembled
with nvdisasm, and the machine code is read:

- loops are found from backward branches; the hot loop is the outermost loop holding the
  most FMAs, the first of them in the listing where several hold as many (flash-swapped's
  K/V step forward, its Q step backward; flash-swapped-tc's steps without the mask test,
  which come before the masked ones and are all but ⌈B_r/B_c⌉ + 1 of a query block's steps);
- one pass of the hot loop is counted as issued instructions, each weighted by the trip
  counts of the loops nested inside it (read from the loop's counter, its step and its
  bound; a nested loop whose count cannot be read is reported and counted once);
  every branch of an if is counted as taken, so masking and dropout code counts in full;
- reported per kernel: instructions per step, the FMA share (FFMA, HMMA) of issued
  instructions, shared-memory loads per FMA split by width (LDS 32-bit, LDS.64,
  LDS.128), stores, warp shuffles, barriers, integer division (a call to the division
  routine or its I2F.RP/MUFU.RCP sequence) and float64 instructions in the loop, local
  memory (spill) traffic, registers, occupancy; ldmatrix (LDSM) counts as a shared load;
- for the tensor-core kernel, the HMMAs a warp issues per step by construction beside those
  read from the listing, so that a misread loop shows;
- ceiling = FMA share × the H100's peak for that FMA: an SM issues one warp instruction
  per scheduler per clock and its FP32 pipes take one warp FFMA per scheduler per clock,
  so with every other instruction issued too, FFMAs reach at most that share of the peak.
  For HMMA the same share bounds the tensor pipe's issue rate, against the fp16 peak.

    pip install -e '.[gpu]'     # numba-cuda[cu13] and nvidia-cuda-nvdisasm
    python -m experiments.kernel_static_model [--out experiments/results/kernels_static_model_sm90]

Writes OUT.json and OUT.md with the versions, the git commit and the command.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from experiments import kernel_resources as resources
from iosim.core.gpus import GPUS

EXPERIMENTS = Path(__file__).resolve().parent
H100 = GPUS["h100"]
TERA = 1e12
# H100 SXM dense peaks from iosim.core.gpus (with their sources there), in whole TFLOP/s as this
# report has always stated them: FP32 67 on CUDA cores, FP16/BF16 with FP32 accumulation 989
# on tensor cores (989.4 in iosim.core.gpus; to the decimal it would move each tensor-core ceiling
# by 0.04 %, below what a ceiling read from an instruction share can tell).
PEAK_TFLOPS = {"FFMA": float(round(H100.fp32.value / TERA)), "HMMA": float(round(H100.fp16_tensor.value / TERA))}

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:(@!?U?P[T0-9]+)\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_FUNCTION = re.compile(r"^\s*\.text\.(\S+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str  # "" or a guard such as "@!P0"
    opcode: str  # with modifiers: "LDS.128", "FFMA.FTZ"
    operands: str

    @property
    def base(self) -> str:
        """The opcode without modifiers: "LDS" for "LDS.U.128"."""
        return self.opcode.split(".")[0]


@dataclass
class Function:
    name: str
    instructions: list[Instruction] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> address of the next instruction


@dataclass(frozen=True)
class Loop:
    start: int  # address of the first instruction (the backward branch's target)
    end: int  # address of the backward branch

    def contains(self, other: Loop) -> bool:
        return self.start <= other.start and other.end <= self.end and self != other

    def holds(self, address: int) -> bool:
        return self.start <= address <= self.end


def parse_sass(text: str) -> list[Function]:
    """The functions of an nvdisasm listing, with their instructions and labels in address order."""
    functions: list[Function] = []
    pending: list[str] = []
    for line in text.splitlines():
        if m := _FUNCTION.match(line):
            functions.append(Function(m.group(1)))
            pending = []
        elif not functions:
            continue
        elif m := _LABEL.match(line):
            pending.append(m.group(1))
        elif m := _INSTRUCTION.match(line):
            ins = Instruction(int(m.group(1), 16), m.group(2) or "", m.group(3), m.group(4).strip())
            for label in pending:
                functions[-1].labels[label] = ins.address
            pending = []
            functions[-1].instructions.append(ins)
    return functions


def loops(fn: Function) -> list[Loop]:
    """Every loop of fn: a branch to a label at or before it closes the loop [target, branch]."""
    found = set()
    for ins in fn.instructions:
        if ins.base == "BRA" and (m := _TARGET.search(ins.operands)):
            target = fn.labels.get(m.group(1))
            if target is not None and target <= ins.address:
                found.add(Loop(target, ins.address))
    return sorted(found, key=lambda lp: (lp.start, -lp.end))


def is_fma(ins: Instruction) -> bool:
    return ins.base in ("FFMA", "HMMA")


_REG = r"(R\d+)"
_IMM = r"(-?0x[0-9a-f]+|-?\d+)"


def _int(text: str) -> int:
    return int(text, 16) if "0x" in text else int(text)


def _initial_value(fn: Function, loop: Loop, reg: str) -> int | None:
    """The immediate (or zero) that the last write before `loop` puts in reg, else None."""
    start = None
    for ins in fn.instructions:
        if ins.address >= loop.start:
            break
        if ins.operands.startswith(reg + ","):
            start = None
            zero = "URZ" if reg.startswith("U") else "RZ"
            if ins.base in ("MOV", "UMOV", "IMAD") and (s := re.match(rf"{reg}, (?:RZ, RZ, )?{_IMM}$", ins.operands)):
                start = _int(s.group(1))
            elif ins.operands in (f"{reg}, {zero}", f"{reg}, RZ, RZ, RZ"):
                start = 0
    return start


def _holds_minus_one(fn: Function, loop: Loop, step: Instruction, reg: str) -> bool:
    """Whether reg holds −1 where `step` reads it: its last write before `step` (in the loop
    body, else before the loop) is a SEL of 0 or 0xffffffff, how Numba's 64-bit range
    counters get their −1."""
    last = None
    for ins in fn.instructions:
        if ins.address >= step.address:
            break
        if ins.operands.startswith(reg + ",") and (ins.address < loop.start or loop.holds(ins.address)):
            last = ins
    return (
        last is not None and last.base in ("SEL", "USEL")
        and re.match(r"U?R\d+, U?RZ, 0xffffffff, ", last.operands) is not None
    )


def trip_count(fn: Function, loop: Loop) -> int | None:
    """Iterations of `loop`, read from its counter, or None when the pattern is not recognised.

    Two counters are recognised, both with a compile-time trip count:
    - up-counter: the closing branch is guarded by an ISETP comparing a register with an
      immediate bound; the register is stepped by an immediate inside the loop (IADD3 or
      VIADD R, R, step) and set to an immediate before it: ⌈(bound − start) / step⌉;
    - down-counter (Numba's range loops lowered as a 64-bit count of the iterations left):
      a (U)ISETP.NE.U32 of the counter against zero and u (U)IADD3s adding −1 (an
      immediate, or a SEL of 0xffffffff) inside the loop (u copies of a body unrolled u
      times), an immediate before it: ⌈(start + 1) / u⌉.
    Loops whose bound is only known at run time (grid-stride loops) give None.
    """
    body = [i for i in fn.instructions if loop.holds(i.address)]
    branch = body[-1]
    pred = branch.predicate.lstrip("@!")
    if pred:
        setp = next((i for i in reversed(body[:-1]) if i.base == "ISETP" and i.operands.startswith(pred + ",")), None)
        m = setp and re.match(rf"{pred}, PT, {_REG}, {_IMM}, PT", setp.operands)
        if m:
            reg, bound = m.group(1), _int(m.group(2))
            step = None
            for ins in body:
                s = re.match(rf"{reg}, {reg}, {_IMM}(?:, RZ)?$", ins.operands)
                if ins.base in ("IADD3", "VIADD") and s:
                    step = _int(s.group(1))
            start = _initial_value(fn, loop, reg)
            if step and start is not None:
                count = -(-(bound - start) // step)
                return count if count > 0 else None
    for setp in body:
        m = re.match(r"U?P\d+, U?PT, (U?R\d+), U?RZ, U?PT$", setp.operands)
        if setp.base in ("ISETP", "UISETP") and ".NE.U32" in setp.opcode and m:
            reg = m.group(1)
            steps = []
            for i in body:
                s = re.match(rf"{reg}, U?P\d+, (\S+), (\S+), U?RZ$", i.operands)
                if i.base in ("IADD3", "UIADD3") and s and reg in s.groups():
                    other = s.group(2) if s.group(1) == reg else s.group(1)
                    if other in ("-0x1", "0xffffffff") or _holds_minus_one(fn, loop, i, other):
                        steps.append(i)
            start = _initial_value(fn, loop, reg)
            if steps and start is not None:
                return -(-(start + 1) // len(steps))  # LLVM's partial unrolling steps it once per copy
    return None


@dataclass(frozen=True)
class StepMix:
    """What one pass of a kernel's hot loop issues, per thread."""

    instructions: int
    ffma: int
    hmma: int
    lds_32: int
    lds_64: int
    lds_128: int
    ldsm: int  # ldmatrix: four 8 × 8 matrices of 16-bit values per warp instruction
    sts: int
    shuffles: int
    barriers: int
    mufu: int
    global_loads: int
    local_memory: int  # LDL/STL: spills or local arrays left in memory
    int_divisions: int
    float64: int
    unresolved_loops: int  # nested loops whose trip count could not be read (counted once)

    @property
    def fma_share(self) -> float:
        return (self.ffma + self.hmma) / self.instructions if self.instructions else 0.0

    @property
    def lds(self) -> int:
        return self.lds_32 + self.lds_64 + self.lds_128 + self.ldsm

    @property
    def lds_per_fma(self) -> float:
        fmas = self.ffma + self.hmma
        return self.lds / fmas if fmas else float("nan")


_DIVISION_CALL = re.compile(r"__cuda_sm\d+_(?:div|rem)")


def step_mix(fn: Function) -> tuple[Loop, StepMix] | None:
    """The hot loop of fn and what one pass of it issues; None for a kernel without loops."""
    all_loops = loops(fn)
    outer = [lp for lp in all_loops if not any(o.contains(lp) for o in all_loops)]
    if not outer:
        return None
    weights = {}
    unresolved = {}
    for top in outer:
        inner = [lp for lp in all_loops if top.contains(lp)]
        trips = {lp: trip_count(fn, lp) for lp in inner}
        unresolved[top] = sum(t is None for t in trips.values())
        for ins in fn.instructions:
            if top.holds(ins.address):
                w = 1
                for lp in inner:
                    if lp.holds(ins.address):
                        w *= trips[lp] or 1
                weights[ins] = (top, w)
    # max keeps the first of equals: the earliest loop in the listing
    hot = max(outer, key=lambda lp: sum(w for ins, (t, w) in weights.items() if t == lp and is_fma(ins)))
    counts: dict[str, int] = {}

    def add(key, w):
        counts[key] = counts.get(key, 0) + w

    total = 0
    division_rcp = False
    for ins, (top, w) in weights.items():
        if top != hot or ins.opcode == "NOP":
            continue
        total += w
        op, base = ins.opcode, ins.base
        if base in ("FFMA", "HMMA"):
            add(base.lower(), w)
        elif base == "LDS":
            add("lds_128" if ".128" in op else "lds_64" if ".64" in op else "lds_32", w)
        elif base == "LDSM":
            add("ldsm", w)
        elif base == "STS":
            add("sts", w)
        elif base == "SHFL":
            add("shuffles", w)
        elif base == "BAR":
            add("barriers", w)
        elif base == "MUFU":
            add("mufu", w)
            division_rcp |= ".RCP" in op
        elif base in ("LDG", "LD"):
            add("global_loads", w)
        elif base in ("LDL", "STL"):
            add("local_memory", w)
        elif base == "CALL" and _DIVISION_CALL.search(ins.operands):
            add("int_divisions", w)
        elif base == "I2F" and ".RP" in op:
            add("int_divisions", w)  # the first instruction of an inline unsigned division
        if base.startswith("D") and base in ("DADD", "DMUL", "DFMA", "DSETP", "DMNMX") or ".F64" in op:
            add("float64", w)
    return hot, StepMix(
        instructions=total,
        ffma=counts.get("ffma", 0),
        hmma=counts.get("hmma", 0),
        lds_32=counts.get("lds_32", 0),
        lds_64=counts.get("lds_64", 0),
        lds_128=counts.get("lds_128", 0),
        ldsm=counts.get("ldsm", 0),
        sts=counts.get("sts", 0),
        shuffles=counts.get("shuffles", 0),
        barriers=counts.get("barriers", 0),
        mufu=counts.get("mufu", 0),
        global_loads=counts.get("global_loads", 0),
        local_memory=counts.get("local_memory", 0),
        int_divisions=counts.get("int_divisions", 0),
        float64=counts.get("float64", 0),
        unresolved_loops=unresolved[hot],
    )


def kernel_function(functions: list[Function]) -> Function:
    """The kernel entry among the listing's functions (the others are runtime helpers)."""
    candidates = [f for f in functions if not f.name.startswith("__")]
    if len(candidates) != 1:
        raise RuntimeError(f"expected one kernel in the listing, found {[f.name for f in candidates]}")
    return candidates[0]


def loop_divisions(fn: Function) -> int:
    """Integer divisions (calls to the division routine, I2F.RP sequences) inside any loop of fn."""
    inside = [i for i in fn.instructions if any(lp.holds(i.address) for lp in loops(fn))]
    return sum(
        1 for i in inside
        if (i.base == "CALL" and _DIVISION_CALL.search(i.operands)) or (i.base == "I2F" and ".RP" in i.opcode)
    )


def nvdisasm() -> str | None:
    from cuda.pathfinder import find_nvidia_binary_utility

    return find_nvidia_binary_utility("nvdisasm")


def require_tools() -> None:
    """Exit with status TOOLCHAIN_MISSING, saying how to get them, without NVVM, nvJitLink or nvdisasm."""
    resources.require_toolchain()
    if nvdisasm() is None:
        print("nvdisasm not found; pip install -e '.[test]' brings it (nvidia-cuda-nvdisasm)", file=sys.stderr)
        sys.exit(resources.TOOLCHAIN_MISSING)


def disassemble(binary: bytes, workdir: Path) -> str:
    path = workdir / "kernel.cubin"
    path.write_bytes(binary)
    return subprocess.run([nvdisasm(), "-c", str(path)], capture_output=True, text=True, check=True).stdout


# ---------------------------------------------------------------------------------------
# Shared-memory banks: which lanes of a warp touch which 4-byte bank, from the layout.
# ---------------------------------------------------------------------------------------

BANKS = 32
WARP = 32


def bank_ways(words: list[int], width: int) -> int:
    """Worst n-way bank conflict of one warp access, 1 when conflict-free.

    words[lane] is the first 4-byte word a lane reads; each lane reads `width` consecutive
    words (1, 2 or 4: LDS, LDS.64, LDS.128). The hardware serves 32/width lanes per
    phase; within a phase, distinct words in one bank are served one after another, and
    lanes reading the same word share it (broadcast).
    """
    if width not in (1, 2, 4):
        raise ValueError(f"width={width} must be 1, 2 or 4 words")
    lanes = WARP // width
    worst = 1
    for first in range(0, len(words), lanes):
        per_bank: dict[int, set[int]] = {}
        for w0 in words[first:first + lanes]:
            for word in range(w0, w0 + width):
                per_bank.setdefault(word % BANKS, set()).add(word)
        worst = max(worst, max(len(s) for s in per_bank.values()))
    return worst


def access_width(words: int) -> int:
    """Words per lane of the widest aligned load covering `words` consecutive floats (at most 4)."""
    return 4 if words % 4 == 0 else 2 if words % 2 == 0 else 1


def layout_accesses(lay) -> dict[str, tuple[list[int], int]]:
    """The first warp's shared-memory accesses in a flash-swapped step, as (words per lane, width).

    Lane = tid; ty = tid // TC, tx = tid mod TC, r0 = ty·TM (kernels/_register_tiles.py).
    Each pattern is taken at its first index (a = b = g = 0, k = c = 0): the others add
    the same offset to every lane and conflict alike.
    """
    lanes = range(min(WARP, lay.threads))
    ty = [t // lay.TC for t in lanes]
    tx = [t % lay.TC for t in lanes]
    cr = [t // lay.copy_lanes for t in lanes]
    cc = [t % lay.copy_lanes for t in lanes]
    return {
        "A·Bᵀ: A rows (LDS.128)": ([y * lay.TM * lay.W for y in ty], 4),
        "A·Bᵀ: B rows (LDS.128)": ([x * lay.W for x in tx], 4),
        "A·B: A rows of a score tile (LDS.128)": ([y * lay.TM * lay.PW for y in ty], 4),
        "A·B: B columns 4(tx + TC·g) (LDS.128)": ([4 * x for x in tx], 4),
        "Aᵀ·B: TM floats of a score-tile row": ([y * lay.TM for y in ty], access_width(lay.TM)),
        "score tile store (STS)": ([y * lay.TM * lay.PW + x for y, x in zip(ty, tx)], 1),
        "tile copy store (STS)": ([r * lay.W + c for r, c in zip(cr, cc)], 1),
    }


def bank_report(lay) -> dict[str, int]:
    return {name: bank_ways(words, width) for name, (words, width) in layout_accesses(lay).items()}


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------

# At the tensor-core peak an H100 SM completes one m16n8k16 HMMA (4,096 FLOPs) per clock:
# 989.4 TFLOP/s = 132 SMs (H100.sms) × 1.83 GHz × 4,096. Its four schedulers issue four instructions per
# clock, so HMMAs need only a quarter of the issued instructions to keep the tensor cores busy.
HMMA_SHARE_AT_PEAK = 0.25


def ceiling_tflops(mix: StepMix) -> float:
    """The FMA share's bound on throughput: FFMA share × FP32 peak, or HMMA share / 0.25 × tensor peak."""
    if mix.hmma:
        return min(1.0, mix.hmma / mix.instructions / HMMA_SHARE_AT_PEAK) * PEAK_TFLOPS["HMMA"]
    return mix.ffma / mix.instructions * PEAK_TFLOPS["FFMA"] if mix.instructions else 0.0


def model_cases() -> list:
    """The kernels whose hot loops matter: the fused kernels and standard's matmul."""
    return [
        c for c in resources.cases((64, 128))
        if c.name.startswith(("flash-swapped", "flash forward", "flash backward"))
        or (c.name.startswith("standard matmul S") and "fp32" in c.name)
    ]


def analyse(case, workdir: Path) -> dict:
    ptx = resources.compile_ptx(case)
    log, cubin = resources.assemble(ptx)
    row = {"kernel": case.name, "threads": case.threads, **resources.parse(log)}
    row.update(resources.occupancy(row["registers"], row["shared_bytes"], case.threads))
    fn = kernel_function(parse_sass(disassemble(cubin, workdir)))
    row["divisions_in_loops"] = loop_divisions(fn)
    found = step_mix(fn)
    if found is None:
        return row
    hot, mix = found
    row["hot_loop"] = {"start": hot.start, "end": hot.end}
    row["step"] = {**asdict(mix), "fma_share": mix.fma_share, "lds_per_fma": mix.lds_per_fma}
    row["ceiling_tflops"] = ceiling_tflops(mix)
    if case.mma_per_step is not None:
        row["hmma_built"] = case.mma_per_step
    if case.layout is not None:
        row["bank_ways"] = bank_report(case.layout)
    return row


def markdown(report: dict) -> str:
    lines = [
        f"# Static performance model of the kernels on {resources.ARCH} (no GPU)",
        "",
        f"- command: `{report['command']}`",
        f"- git commit: `{report['git_commit']}` (the kernel sources compiled)",
        f"- machine: {report['machine']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "- step: one pass of the kernel's hot loop (the outermost loop holding the most FMAs), per thread,",
        "  nested loops weighted by their trip counts; both arms of every branch counted (masking, dropout)",
        f"- ceiling: FFMA share × {PEAK_TFLOPS['FFMA']:g} TFLOP/s (H100 FP32), or HMMA share / "
        f"{HMMA_SHARE_AT_PEAK} × {PEAK_TFLOPS['HMMA']:g} TFLOP/s (fp16 and bf16 tensor cores), capped at that peak",
        "",
        "| kernel | instr/step | FFMA | HMMA | FMA share | LDS 32/64/128/LDSM | LDS per FMA | shuffles | div in loops "
        "| regs | spill st/ld (B) | blocks/SM (limit) | ceiling TFLOP/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in report["kernels"]:
        s = k.get("step")
        if s is None:
            continue
        unresolved = f" ({s['unresolved_loops']} loops counted once)" if s["unresolved_loops"] else ""
        lines.append(
            f"| {k['kernel']} | {s['instructions']}{unresolved} | {s['ffma']} | {s['hmma']} | {s['fma_share']:.1%} | "
            f"{s['lds_32']}/{s['lds_64']}/{s['lds_128']}/{s['ldsm']} | {s['lds_per_fma']:.3f} | {s['shuffles']} | "
            f"{k['divisions_in_loops']} | {k['registers']} | {k['spill_store_bytes']}/{k['spill_load_bytes']} | "
            f"{k['blocks_per_sm']} ({k['limited_by']}) | {k['ceiling_tflops']:.1f} |"
        )
    built = [k for k in report["kernels"] if "hmma_built" in k and "step" in k]
    if built:
        misread = [k["kernel"] for k in built if k["step"]["hmma"] != k["hmma_built"]]
        lines += ["", (
            f"HMMAs per step read from the listing equal the kernel's construction count "
            f"({', '.join(sorted({str(k['hmma_built']) for k in built}))}) for all {len(built)} tensor-core rows."
            if not misread else "HMMAs per step read from the listing differ from the construction count for: "
            + "; ".join(f"{k['kernel']} ({k['step']['hmma']} read, {k['hmma_built']} built)"
                        for k in built if k["kernel"] in misread)
        )]
    banked = [k for k in report["kernels"] if "bank_ways" in k]
    if banked:
        patterns = list(banked[0]["bank_ways"])
        lines += [
            "",
            "Shared-memory bank conflicts of the first warp, from the thread layout (1 = conflict-free, n = n-way):",
            "",
            "| kernel | " + " | ".join(patterns) + " |",
            "| --- |" + " ---: |" * len(patterns),
        ]
        for k in banked:
            lines.append(f"| {k['kernel']} | " + " | ".join(str(k["bank_ways"][p]) for p in patterns) + " |")
    return "\n".join(lines) + "\n"


def versions() -> dict:
    from importlib.metadata import version

    out = resources.versions()
    out["nvidia-cuda-nvdisasm"] = version("nvidia-cuda-nvdisasm")
    return out


def machine() -> str:
    import os
    import platform

    return f"{os.cpu_count()}-core {platform.machine()} without a GPU; static {resources.ARCH} analysis"


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=EXPERIMENTS / "results" / "kernels_static_model_sm90")
    parser.add_argument("--only", default="", help="analyse only kernels whose name contains this text")
    args = parser.parse_args()
    require_tools()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in model_cases():
            if args.only not in case.name:
                continue
            row = analyse(case, Path(tmp))
            rows.append(row)
            step = row.get("step", {})
            print(f"{case.name}: {step.get('instructions')} instr/step, FMA share {step.get('fma_share', 0):.1%}, "
                  f"{row['registers']} regs, spills {row['spill_store_bytes']}/{row['spill_load_bytes']} B", flush=True)
    resources.write_report(args.out, {"machine": machine(), "versions": versions(), "peak_tflops": PEAK_TFLOPS,
                                      "kernels": rows}, markdown)


if __name__ == "__main__":
    main()
