"""Every Python block of the README runs as written (the kernels' under Numba's CUDA simulator, as every test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_python_block_runs(index):
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {})


def saved_record_keys() -> dict[str, str]:
    """The README's table of saved records: each key of its first column, with the meaning beside it."""
    section = README.read_text().split("### Saved records", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            keys, meaning = line[2:].split(" | ", 1)
            table.update((key, meaning) for key in re.findall(r"`([^`]+)`", keys))
    return table


def test_the_readme_names_every_key_sweep_and_run_save_and_which_command_saves_it(tmp_path):
    from iosim.cli import main

    saved = {}
    for command in (["sweep", "--N", "256", "--d", "64", "--algo", "flash", "split-kv"],
                    ["run", "--N", "64", "--d", "16", "--algo", "split-kv"]):
        path = tmp_path / f"{command[0]}.json"
        assert main([*command, "--gpu", "h100", "--json", str(path)]) == 0
        records = json.loads(path.read_text())
        saved[command[0]] = set().union(*(records if isinstance(records, list) else [records]))
    table = saved_record_keys()
    assert set(table) == saved["sweep"] | saved["run"]
    for key, meaning in table.items():
        only = re.match(r"(sweep|run) only", meaning)
        if only:
            assert key not in saved["run" if only[1] == "sweep" else "sweep"], key
        else:
            assert key in saved["sweep"] and key in saved["run"], key
