"""The two scripts of experiments/ that regenerate's fast outputs and the other tests do not run: each once at tiny
sizes (``--smoke``), so that a change that breaks one fails CI (issue 30, item 5)."""

from __future__ import annotations

import json

from experiments import sawtooth, speed


def test_the_sawtooth_script_runs_both_orders_and_both_schedules(tmp_path):
    out = tmp_path / "sawtooth.json"
    sawtooth.main(["--smoke", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    # K and V of a head (1 MB) fit the L2 many times over: every order and schedule reads them once per head
    once = row["batch_heads"] * 2 * row["N"] * row["d"] * 2
    assert row["kv_read_plain"] == row["kv_read_sawtooth"] == row["kv_read_plain_staggered"] == once
    assert row["kv_read_sawtooth_staggered"] == once


def test_the_speed_script_runs_every_part(tmp_path):
    out = tmp_path / "speed.json"
    speed.main(["--smoke", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["smoke"] and len(result["commands"]) == len(speed.SMOKE_COMMANDS)
    assert [r["pass_"] for r in result["numeric"]] == ["fwd", "bwd"]
    assert result["records"]["seconds"] > 0 and result["records"]["seconds_with_json_and_csv"] > 0
    assert [(r["impl"], r["direction"]) for r in result["l2"]] == [(c[0], c[1]) for c in speed.SMOKE_L2]
    assert set(result["huge_count_seconds"]) == {"flash", "flash causal"}
