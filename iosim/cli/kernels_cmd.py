"""``iosim kernels``: the kernel descriptions the DRAM level runs, with the algorithm each implements and its
sources."""

from __future__ import annotations

import argparse

from iosim.cli.common import add_outputs
from iosim.cli.render import compact_table, print_table
from iosim.gpu.kernels import KERNELS, default_kernel
from iosim.gpu.occupancy import report
from iosim.reports.records import check_distinct, check_output_path, write_records


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="the GPU kernels the DRAM level describes (--kernel NAME): the algorithm each "
                                       "implements, its passes, options and sources")
    add_outputs(p, "one record per kernel")


def records() -> list[dict]:
    """One record per kernel description, the default of its algorithm first; its passes, options, what it takes,
    its builds' dtypes (None: those its source names) and the GPU presets it runs on (None: any) as lists."""
    rows = []
    for k in sorted(KERNELS.values(), key=lambda k: (k.algorithm, default_kernel(k.algorithm) is not k, k.name)):
        rows.append(dict(kernel=k.name, algorithm=k.algorithm, default=default_kernel(k.algorithm) is k,
                         passes=["fwd", "bwd"] if k.backward else ["fwd"], options=list(k.options),
                         takes=list(k.takes), dtypes=list(k.dtypes) if k.dtypes else None,
                         closed_form=k.forward_dram is not None, own_tile=k.tile is not None,
                         timed=k.rate is not None, runs_on=list(k.runs_on) if k.runs_on else None, source=k.source))
    return rows


def run(args: argparse.Namespace) -> list[dict]:
    check_distinct({"json": check_output_path("json", args.json), "csv": check_output_path("csv", args.csv)})
    rows = records()
    write_records(args.json, args.csv, rows)
    return rows


def main(args: argparse.Namespace, console) -> None:
    rows = run(args)
    table = compact_table(("kernel", "algorithm", "default", "passes", "options", "takes"), left="kernel")
    for r in rows:
        table.add_row(r["kernel"], r["algorithm"], "yes" if r["default"] else "", ", ".join(r["passes"]),
                      " ".join(r["options"]), " ".join(r["takes"]))
    print_table(console, table)
    def grouped(field: str) -> dict[str, list[str]]:  # the kernels by the list ``field`` holds ("": None)
        groups: dict[str, list[str]] = {}
        for r in rows:
            groups.setdefault(" ".join(r[field] or ()), []).append(r["kernel"])
        return groups

    console.print("built for (DRAM bytes are refused in any other dtype): " + "; ".join(
        f"{dtypes or 'the dtypes their sources below name'}: {', '.join(names)}"
        for dtypes, names in grouped("dtypes").items()))
    console.print("run on these GPU presets only (the others refuse them by name): " + "; ".join(
        f"{gpus}: {', '.join(names)}" for gpus, names in grouped("runs_on").items() if gpus))
    console.print("launch their own tiles, whatever the request's: "
                  + ", ".join(r["kernel"] for r in rows if r["own_tile"]))
    console.print("takes: fp8, FP8 data (--dtype float8_e4m3); d_v, a V head size apart from d (--d-v)")
    console.print("forward timed on a GPU, so --schedule timed runs them: "
                  + ", ".join(r["kernel"] for r in rows if r["timed"]))
    for r in rows:
        console.print(f"{r['kernel']}: {r['source']}")
    console.print(f"resource report: {report().path.name}, kernels at {report().commit[:7]}")
