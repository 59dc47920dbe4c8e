"""The scripts of experiments/ that regenerate's fast outputs and the other tests do not run: each once at tiny sizes
(``--smoke``, or a smaller grid), so that a change that breaks one fails CI (issue 30, item 5)."""

from __future__ import annotations

import json

from experiments import sawtooth, sawtooth_orders, speed, timed_call3


def test_the_sawtooth_script_runs_both_orders(tmp_path):
    out = tmp_path / "sawtooth.json"
    sawtooth.main(["--smoke", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    # K and V of a head (1 MB) fit the L2 many times over: both orders read them once per head
    once = row["batch_heads"] * 2 * row["N"] * row["d"] * 2
    assert row["kv_read_plain"] == row["kv_read_sawtooth"] == once


def test_the_speed_script_runs_every_part(tmp_path):
    out = tmp_path / "speed.json"
    speed.main(["--smoke", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["smoke"] and len(result["commands"]) == len(speed.SMOKE_COMMANDS)
    assert [r["pass_"] for r in result["numeric"]] == ["fwd", "bwd"]
    assert result["records"]["seconds"] > 0 and result["records"]["seconds_with_json_and_csv"] > 0
    assert [(r["impl"], r["direction"]) for r in result["l2"]] == [(c[0], c[1]) for c in speed.SMOKE_L2]
    assert set(result["huge_count_seconds"]) == {"flash", "flash causal"}
    grid = tmp_path / "grid.json"
    speed.main(["--smoke", "--only", "grid", "--out", str(grid)])
    found = json.loads(grid.read_text())
    rows = found["grid"]  # the first row of the first grid, a forward with a measured rate
    assert [(r["grid"], r["index"], r["schedule"]) for r in rows] == [(speed.GRIDS[0], 0, s) for s in ("lockstep",
                                                                                                       "timed")]
    assert all(r["seconds"] > 0 for r in rows)
    (floor,) = found["timed_floor"]  # its event loop three ways: 1 head of N = 131,072 at (32, 16), 4,096 × 8,192 steps
    assert (floor["grid"], floor["index"], floor["steps"]) == (speed.GRIDS[0], 0, 4096 * 8192)
    assert all(floor[k] > 0 for k in ("loop_seconds", "zero_spread_seconds", "without_l2_seconds"))
    rates = tmp_path / "rates.json"
    speed.main(["--smoke", "--only", "rates", "--out", str(rates)])
    (rate,) = json.loads(rates.read_text())["rates"]  # flash's decode over grouped heads, simulated block by block
    assert (rate["path"], rate["N_k"], rate["causal"]) == ("simulation", speed.SMOKE_RATES[0]["N_k"], True)
    assert rate["tile_visits"] == 32 * -(-rate["N_k"] // rate["Bc"]) and rate["visits_per_s"] > 0


def test_the_sawtooth_orders_script_runs_its_three_orders_on_both_presets(tmp_path, monkeypatch):
    monkeypatch.setattr(sawtooth_orders, "NS", [4096])  # K and V of the head fit either L2: each order reads them once
    sawtooth_orders.main(["--figures", str(tmp_path), "--json", str(tmp_path / "orders.json")])
    rows = json.loads((tmp_path / "orders.json").read_text())["rows"]
    assert len(rows) == len(sawtooth_orders.PRESETS) * len(sawtooth_orders.ORDERS)
    assert all(r["kv_over_once"] == 1.0 for r in rows) and (tmp_path / "sawtooth_orders.png").exists()


def test_the_timed_script_explains_and_predicts(tmp_path):
    # no measured row of call 3 is as small as this: the explanation runs through them and keeps none
    assert timed_call3.main(["--max-steps", "2000", "--out", str(tmp_path / "explained.json")])["rows"] == []
    found = timed_call3.main(["--predict", "call3-sdpa", "--max-steps", "2000", "--out", str(tmp_path / "p.json")])
    (row,) = found["rows"]  # SDPA's 16 × 1024 forward: 16 heads of 8 × 8 tiles
    assert row["steps"] == 1024 and [x["block_spread"] for x in row["timed"]] == [0.0, 0.01]
    assert all(x["read"] == 3 * 16 * 1024 * 64 * 2 for x in row["timed"])  # everything fits: Q, K, V once
