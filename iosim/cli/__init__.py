"""Command line: ``iosim sweep`` (count-only grid), ``iosim run`` (one numeric simulation), ``iosim optimize``,
``iosim bound``, ``iosim prefill`` (chunked prefill), ``iosim cascade`` (decoding over a shared prefix) and
``iosim model`` (a whole model's attention), ``iosim kernels`` (the GPU kernels the DRAM level describes) and
``iosim gpus`` (the hardware presets and their sources).

One module per command (``sweep_cmd``, ``run_cmd``, ``optimize_cmd``, ``bound_cmd``, ``prefill_cmd``, ``cascade_cmd``,
``model_cmd``, ``kernels_cmd``, ``gpus_cmd``),
each owning its arguments (``add_parser``), its work (``run``, which returns data and
which tests call) and its rendering (``main``, with rich). This module only builds the
parser and dispatches. Bad input (``iosim.InputError``, a ``CapacityError``, an
unwritable file) is one line on stderr and exit status 2; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys

from iosim.cli import (
    bound_cmd,
    cascade_cmd,
    gpus_cmd,
    kernels_cmd,
    model_cmd,
    optimize_cmd,
    prefill_cmd,
    run_cmd,
    sweep_cmd,
)
from iosim.cli.common import Parser, UsageError, package_version
from iosim.cli.optimize_cmd import OptimizeOutcome
from iosim.cli.run_cmd import RunOutcome
from iosim.cli.sweep_cmd import SweepOutcome
from iosim.core.errors import InputError
from iosim.core.memory import CapacityError
from iosim.reports.records import is_stdout

COMMANDS = {"sweep": sweep_cmd, "run": run_cmd, "optimize": optimize_cmd, "bound": bound_cmd, "prefill": prefill_cmd,
            "cascade": cascade_cmd, "model": model_cmd, "kernels": kernels_cmd, "gpus": gpus_cmd}

__all__ = ["COMMANDS", "OptimizeOutcome", "RunOutcome", "SweepOutcome", "build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="iosim", description="HBM traffic of attention: simulated, predicted, checked.")
    parser.add_argument("--version", action="version", version=f"iosim {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def run(args: argparse.Namespace, **callbacks):
    """Execute a parsed command and return its results as data (the command's ``run``)."""
    return COMMANDS[args.command].run(args, **callbacks)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    try:
        args = build_parser().parse_args(argv)
        # records streamed to standard output (--json /dev/stdout) stay a clean stream: the table goes to stderr
        console = Console(stderr=any(is_stdout(getattr(args, name, None)) for name in ("json", "csv")))
        COMMANDS[args.command].main(args, console)
    except (UsageError, InputError, CapacityError, OSError) as err:
        print(f"iosim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iosim: interrupted", file=sys.stderr)
        return 130
    return 0
