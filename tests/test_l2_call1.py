"""Call 1's committed L2-model table reproduces on its small rows (experiments/l2_call1.py, in CI at a fraction of
its 400 s): every byte the committed file predicts for the one-head rows up to N = 4096, at the effective and the
swept capacities. (l2_call1-staggered.json, under the retired staggered schedule, is kept as committed.)"""

from __future__ import annotations

import json

from experiments import l2_call1
from experiments.regenerate import RECORD_BYTES


def byte_values(predicted: dict) -> dict:
    return {(label, key): part[key] for label, part in predicted.items() if isinstance(part, dict)
            for key in RECORD_BYTES if key in part}


def test_the_committed_small_rows_reproduce():
    committed = json.loads((l2_call1.REPO / "experiments/results/gpu/l2_call1.json").read_text())
    small = [r for r in committed["rows"] if r["batch"] * r["heads"] == 1 and r["n_q"] <= 4096]
    assert len(small) >= 8
    for row in small:
        assert byte_values(l2_call1.predict(row)) == byte_values(row["predicted"]), row["impl"]
