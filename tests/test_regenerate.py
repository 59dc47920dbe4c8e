"""Every committed figure and JSON has its command, and those that take seconds are what that command makes today.

experiments/regenerate.py declares each output with the command that writes it. A change to a count, a figure
script or a record's layout that leaves a committed output stale fails here, naming the file and the first fields
that differ; ``python -m experiments.regenerate --check`` also runs the outputs that take minutes.
"""

from __future__ import annotations

import subprocess

import pytest
from helpers import REPO

from experiments import regenerate


def test_every_fast_output_reproduces(tmp_path):
    verdicts = regenerate.check(regenerate.select(fast=True), tmp_path)
    stale = [line for v in verdicts if v.status != "reproduces" for line in v.lines()]
    assert not stale, "these committed outputs are not what their commands make now:\n" + "\n".join(stale)


def test_every_committed_figure_and_json_is_declared_with_its_command():
    """A file under docs/figures or experiments/results (the GPU call scripts aside) that no command declares, or a
    declared file that is missing, fails here."""
    listed = subprocess.run(["git", "ls-files", "docs/figures", "experiments/results", "iosim/gpu/*.json"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    committed = {f for f in listed.stdout.split() if not f.endswith((".sh", ".py")) and (REPO / f).exists()}
    declared = {f for output in regenerate.OUTPUTS for f in output.files}
    assert committed <= declared, f"committed, but made by no declared command: {sorted(committed - declared)}"
    missing = sorted(f for f in declared if not (REPO / f).exists())
    assert not missing, f"declared, but not in the checkout: {missing}"


def test_the_comparison_leaves_out_timings_and_commits_and_nothing_else():
    committed = {"rows": [{"N": 4096, "bytes": 1.0, "seconds": 3.0}], "commit": "abc", "machine": {"node": "vm"}}
    rerun = {"rows": [{"N": 4096, "bytes": 1.0 + 1e-12, "seconds": 9.0}], "commit": "def"}
    assert regenerate.differences(regenerate.deterministic(committed), regenerate.deterministic(rerun)) == []
    changed = {"rows": [{"N": 4097, "bytes": 1.0, "seconds": 3.0}]}
    assert regenerate.differences(regenerate.deterministic(committed), regenerate.deterministic(changed)) == [
        ".rows[0].N: committed 4096, now 4097"]
    # a float off by more than the tolerance, and an int that became a float, are differences
    assert regenerate.differences({"x": 1.0}, {"x": 1.0 + 1e-6}) and regenerate.differences({"x": 1}, {"x": True})


def test_an_output_of_a_retired_schedule_is_kept_neither_rerun_nor_checked(tmp_path):
    retired = [o for o in regenerate.OUTPUTS if o.kind == regenerate.RETIRED]
    assert {o.name for o in retired} >= {"l2_call1-staggered", "predictions-92a2cc8-staggered"}
    assert all("--schedule staggered" in o.command for o in retired)
    for output in retired:
        assert regenerate.not_rerun(output, named=True) == (
            f"made under a retired schedule (its command runs at {regenerate.RETIRED_AT})")
        verdict = regenerate.check_one(output, tmp_path)
        assert verdict.status == "not checked" and not list(tmp_path.iterdir())  # nothing ran
    listed = regenerate.listing(retired)
    assert listed.count(f"(at {regenerate.RETIRED_AT})") == len(retired)
