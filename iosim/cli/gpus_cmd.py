"""``iosim gpus``: the hardware presets (``--gpu NAME``), every number side by side, and where each comes from."""

from __future__ import annotations

import argparse

from iosim.cli.common import add_outputs
from iosim.cli.render import compact_table, eng, nbytes, print_table
from iosim.core.gpus import GPU, GPUS, Spec, get_gpu
from iosim.reports.records import check_distinct, check_output_path, write_records

# (field of GPU, its name in the records, its label in the 80-column table, the unit of its value)
NUMBERS = (("sms", "SMs", "SMs", "count"), ("smem_per_sm", "shared memory per SM", "smem/SM", "bytes"),
           ("l2", "L2, nominal", "L2", "bytes"), ("l2_effective", "L2, effective", "L2 effective", "bytes"),
           ("hbm_bandwidth", "DRAM bandwidth", "DRAM B/s", "bytes/s"),
           ("fp16_tensor", "FP16 tensor FLOP/s", "FP16 FLOP/s", "FLOP/s"),
           ("bf16_tensor", "BF16 tensor FLOP/s", "BF16 FLOP/s", "FLOP/s"),
           ("fp8_tensor", "FP8 tensor FLOP/s", "FP8 FLOP/s", "FLOP/s"),
           ("fp32", "FP32 FLOP/s", "FP32 FLOP/s", "FLOP/s"))
SM_NUMBERS = (("blocks", "resident blocks per SM", "blocks/SM", "count"),
              ("threads", "resident threads per SM", "threads/SM", "count"),
              ("reserved_per_block", "shared memory kept back per block", "smem reserve", "bytes"),
              ("smem_unit", "shared memory allocation unit", "smem unit", "bytes"))
LABELS = {number: label for _, number, label, _ in NUMBERS + SM_NUMBERS}


def add_parser(sub) -> None:
    p = sub.add_parser("gpus", help="the hardware presets (--gpu NAME): every number side by side, each with its "
                                    "source")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"presets to show with the source of each number, of {', '.join(sorted(GPUS))} (default: "
                        f"every preset's numbers, without their sources)")
    add_outputs(p, "one record per preset and number, with its source")


def records(gpus: dict[str, GPU] = GPUS) -> list[dict]:
    """One record per preset and number: the preset's name (``gpu``: "H100", as every command's records have it), its
    compute capability, the number's value, unit and source; a number a preset lacks (the T4's BF16 and FP8 tensor
    cores) has none."""
    rows = []
    for gpu in gpus.values():
        name, cc = gpu.name, gpu.sm.compute_capability
        for field, number, _, unit in NUMBERS:
            spec: Spec | None = getattr(gpu, field)
            rows.append(dict(gpu=name, compute_capability=cc, number=number,
                             value=None if spec is None else spec.value, unit=unit,
                             source=None if spec is None else spec.source))
        for field, number, _, unit in SM_NUMBERS:
            rows.append(dict(gpu=name, compute_capability=cc, number=number, value=getattr(gpu.sm, field), unit=unit,
                             source=gpu.sm.source))
    return rows


def chosen(names: list[str]) -> dict[str, GPU]:
    """The presets named, each once and in the order given (``get_gpu`` refuses another name); all without names."""
    return {name: get_gpu(name) for name in dict.fromkeys(names)} if names else GPUS


def run(args: argparse.Namespace) -> list[dict]:
    gpus = chosen(args.names)
    check_distinct({"json": check_output_path("json", args.json), "csv": check_output_path("csv", args.csv)})
    rows = records(gpus)
    write_records(args.json, args.csv, rows)
    return rows


def shown(value, unit: str | None) -> str:
    """A value for the table: bytes in binary units where they are a whole number of them (228KiB, 50MiB, as the
    sources give them), else decimal (37MB); rates and FLOP/s with a prefix; counts as they are; none as a dash."""
    if value is None:
        return "–"
    if unit == "bytes":
        for size, suffix in ((2**20, "MiB"), (2**10, "KiB")):
            if value >= size and value % size == 0:
                return f"{int(value) // size}{suffix}"
        return nbytes(value)
    if unit == "bytes/s":  # to 4 digits, as datasheets quote them (1,555 GB/s, 3.35 TB/s)
        return f"{value / 1e12:.4g}TB/s" if value >= 1e12 else f"{value / 1e9:.4g}GB/s"
    if unit == "FLOP/s":
        return eng(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def main(args: argparse.Namespace, console) -> None:
    rows = run(args)
    names = list(dict.fromkeys(r["gpu"] for r in rows))
    table = compact_table(("", *names), left="")
    by = {(r["gpu"], r["number"]): r for r in rows}
    table.add_row("compute cap.", *(by[name, "SMs"]["compute_capability"] for name in names))
    for number, label in LABELS.items():
        table.add_row(label, *(shown(by[name, number]["value"], by[name, number]["unit"]) for name in names))
    print_table(console, table)
    if not args.names:
        console.print("each number's source: iosim gpus NAME (e.g. iosim gpus h200), or --json / --csv")
    for name in names if args.names else ():
        sources: dict[str, list[str]] = {}  # the numbers of one source together (the SM's limits share one)
        for r in rows:
            if r["gpu"] == name and r["source"] is not None:
                sources.setdefault(r["source"], []).append(r["number"])
        for source, numbers in sources.items():
            console.print(f"{name} {', '.join(numbers)}: {source}")

