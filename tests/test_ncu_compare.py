"""experiments/ncu_traffic.py compare: ncu's CSV against iosim's count, offline, on a hand-made folder.

The simulated bytes are worked out by hand here for a tiling that is not the kernels'
default, so a compare that took the tiling from anywhere but configs.json would fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import ncu_traffic as ncu

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _rows(kernel_id: int, name: str, grid: int, read: str, write: str, unit: str = "byte") -> list[str]:
    common = (
        f'"{kernel_id}","7","python3.12","127.0.0.1","{name}","1","7","(64, 1, 1)",'
        f'"({grid}, 1, 1)","0","9.0","m"'
    )
    return [
        f'{common},"dram__bytes_read.sum","{unit}","{read}"',
        f'{common},"dram__bytes_write.sum","{unit}","{write}"',
    ]


def _marker(kernel_id: int, index: int) -> list[str]:
    return _rows(kernel_id, f"__main__::{ncu.MARKER}[v1,abc]", index + 1, "2,560", "0")


CONFIGS = [
    # flash-swapped forward at B_r=16, B_c=8: the kernels would choose 64×32 for d=16
    {"impl": "flash-swapped", "direction": "forward", "batch": 1, "heads": 2, "n_q": 64, "n_k": 64, "d": 16,
     "dtype": "float32", "causal": False, "dropout_p": 0.0, "tiling": {"Br": 16, "Bc": 8, "TM": 4, "TN": 2}},
    {"impl": "flash", "direction": "backward", "batch": 1, "heads": 1, "n_q": 64, "n_k": 64, "d": 16,
     "dtype": "float32", "causal": False, "dropout_p": 0.0, "tiling": {"Br": 8, "Bc": 8, "TM": 1, "TN": 1}},
]


def _folder(tmp_path: Path, lines: list[str]) -> Path:
    folder = tmp_path / "ncu"
    folder.mkdir()
    (folder / "configs.json").write_text(json.dumps(CONFIGS))
    prof = "==PROF== Connected to process 7 (/usr/bin/python3.12)"
    (folder / "ncu.csv").write_text("\n".join([prof, HEADER, *lines, prof]) + "\n")
    return folder


def test_compare_sums_kernels_per_marker_and_divides_by_the_hand_count(tmp_path):
    lines = [
        *_marker(0, 0), *_rows(1, "kernel[v29,x]", 8, "36,864", "9,216"),
        *_marker(2, 1), *_rows(3, "row_dot_kernel[v31,x]", 4, "1,000", "24"), *_rows(4, "kernel[v33,x]", 8, "500", "0"),
    ]
    folder = _folder(tmp_path, lines)
    prefix = tmp_path / "out" / "cmp"
    args = ncu.build_parser().parse_args(["compare", str(folder), "--out", str(prefix)])
    rows = ncu.run(args)

    fwd, bwd = rows
    # By hand, 2 heads, N = 64, d = 16, 4 bytes, T_r = 64/16 = 4 query blocks:
    # reads Q once (2·64·16·4 = 8192) and K, V once per query block (2·4·2·64·16·4 = 65536);
    # writes O, ℓ, m once (2·64·(16+2)·4 = 9216); compulsory reads Q, K, V once (2·3·64·16·4 = 24576).
    sim = fwd["simulated"]
    assert (sim["Br"], sim["Bc"]) == (16, 8)
    assert sim["M"] == 2 * 16 * 16 + 2 * 8 * 16 + 16 * 8 + 4 * 16  # Q_i, O_i, K_j, V_j, S_ij, four statistics
    assert (sim["read_bytes"], sim["write_bytes"]) == (8192 + 65536, 9216)
    assert sim["compulsory"] == {"read_bytes": 24576, "write_bytes": 9216}
    assert fwd["measured"]["kernels"] == ["kernel[v29,x]"]
    assert fwd["read_ratio"] == pytest.approx(0.5) and fwd["write_ratio"] == pytest.approx(1.0)
    assert fwd["read_over_compulsory"] == pytest.approx(1.5) and fwd["write_over_compulsory"] == pytest.approx(1.0)

    assert bwd["measured"]["read_bytes"] == 1500 and bwd["measured"]["write_bytes"] == 24
    assert len(bwd["measured"]["kernels"]) == 2
    assert "simulated" not in bwd and "read_ratio" not in bwd

    assert json.loads(prefix.with_name("cmp.json").read_text()) == rows
    source, blank, *table = prefix.with_name("cmp.md").read_text().splitlines()
    assert str(folder / "ncu.csv") in source and blank == ""
    assert len(table) == 4
    assert table[2].startswith("| flash-swapped | forward | 2 | 64 | 16 | 16×8 | 960 | 0.0 | 0.1 | 0.500 | 1.50 |")
    assert table[3].startswith("| flash | backward | 1 | 64 | 16 | 8×8 | – |")


def test_compare_defaults_to_files_in_the_profiled_folder(tmp_path):
    folder = _folder(tmp_path, [*_marker(0, 0), *_rows(1, "kernel[v29,x]", 8, "1", "1")])
    ncu.compare(folder)
    assert {p.name for p in folder.iterdir()} == {"configs.json", "ncu.csv", "traffic.json", "traffic.md"}


@pytest.mark.parametrize(
    "lines, words",
    [
        ([*_rows(0, "kernel[v29,x]", 8, "1", "1"), *_marker(1, 0)], "before any marker"),
        ([*_marker(0, 0), *_rows(1, "kernel[v29,x]", 8, "1", "1", unit="Kbyte")], "--print-units base"),
    ],
)
def test_a_csv_that_cannot_be_attributed_in_bytes_is_rejected(tmp_path, lines, words):
    folder = _folder(tmp_path, lines)
    with pytest.raises(ValueError, match=words):
        ncu.compare(folder)


def test_compare_joins_the_predictions_made_before_the_run_on_every_key(tmp_path):
    folder = _folder(tmp_path, [*_marker(0, 0), *_rows(1, "kernel[v29,x]", 8, "30,000", "1,000"),
                                *_marker(2, 1), *_rows(3, "kernel[v33,x]", 8, "500", "0")])
    # configs and predictions written before grouped heads, splits and the sawtooth order have none of them
    keys = {k: CONFIGS[0][k] for k in ncu.JOIN if k in CONFIGS[0]}
    assert "sawtooth" not in keys and "kv_heads" not in keys
    predicted = {"commit": "abc1234", "rows": [
        {**keys, "predicted": {"effective": {"reads": 24_000, "writes": 2_000}}},
        {**keys, "causal": True, "predicted": {"effective": {"reads": 1, "writes": 1}}},  # another key: not joined
        {**keys, "kv_heads": 1, "predicted": {"effective": {"reads": 2, "writes": 2}}},  # grouped heads: not joined
        {**keys, "sawtooth": True, "predicted": {"effective": {"reads": 3, "writes": 3}}},  # the other order
    ]}
    path = tmp_path / "predictions-abc1234.json"
    path.write_text(json.dumps(predicted))
    fwd, bwd = ncu.compare(folder, tmp_path / "cmp", predictions=path)
    assert (fwd["dram_read_pred_bytes"], fwd["dram_write_pred_bytes"]) == (24_000, 2_000)
    assert fwd["dram_read_ratio"] == pytest.approx(30_000 / 24_000) and fwd["dram_write_ratio"] == pytest.approx(0.5)
    assert fwd["predictions"] == {"file": str(path), "commit": "abc1234"}
    assert "dram_read_pred_bytes" not in bwd  # no prediction for the backward row: listed without one
    source, _, head, _, first, second = (tmp_path / "cmp.md").read_text().splitlines()
    assert "abc1234" in source and head.endswith("L2 read MB | read meas/L2 | L2 write MB | write meas/L2 |")
    assert first.endswith("| 0.0 | 1.25 | 0.0 | 0.500 |") and second.endswith("| – | – | – | – |")


def test_launch_runs_each_configuration_after_its_marker(monkeypatch, capsys):
    # the simulator has no profiler calls: stand-ins record the window each pass runs in
    from numba import cuda

    window = []
    monkeypatch.setattr(cuda, "profile_start", lambda: window.append("start"), raising=False)
    monkeypatch.setattr(cuda, "profile_stop", lambda: window.append("stop"), raising=False)
    configs = [ncu.LaunchConfig("flash-swapped", direction, 1, 1, 16, 16, 16, "float32")
               for direction in ("forward", "backward")]
    ncu.launch(configs, only=[1])
    assert window == ["start", "stop"]
    assert capsys.readouterr().out.splitlines() == [f"launched 1: {configs[1]}"]
