"""experiments/register_occupancy.py: the prediction of how many 2-warp blocks an H100 SM holds, and its comparison
with ncu's occupancy sections (on a CSV laid out as ncu writes it)."""

from __future__ import annotations

from experiments import register_occupancy as ro
from experiments.call3_short import halves

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def ncu_csv(folder, registers: int, achieved: float, calculator: int) -> None:
    kernel = '"1","1","python3","h","kernel(Array<float, 4>)","1","7","(64, 1, 1)","(8192, 1, 1)","0","9.0"'
    rows = [("Launch Statistics", "Registers Per Thread", "register/thread", registers),
            ("Occupancy", "Block Limit Registers", "block", calculator),
            ("Occupancy", "Theoretical Occupancy", "%", 100 * 2 * calculator / 64),
            ("Occupancy", "Achieved Occupancy", "%", achieved), ("Occupancy", "Achieved Active Warps", "warp", "n/a")]
    marker = '"0","1","python3","h","ncu_config_marker","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0"'
    folder.mkdir()
    (folder / "ncu.csv").write_text("\n".join(
        ["==PROF== Connected to process 1", HEADER, f'{marker},"Launch Statistics","Registers Per Thread",'
         '"register/thread","16"'] + [f'{kernel},"{s}","{n}","{u}","{v}"' for s, n, u, v in rows]) + "\n")


def test_the_prediction_parts_the_two_register_rules_on_the_grids_build():
    record = ro.predict()
    (row,) = record["rows"]
    # 196 registers x 64 threads: 6,400 a warp; 2 warps in each of 4 sub-partitions of 16,384 -> 8 warps, 4 blocks;
    # the whole file, 65,536 // 12,800 -> 5; 8,192 blocks over 132 SMs: 15.5 waves of 528, 12.4 of 660
    assert (row["threads"], row["registers"], row["blocks"]) == (64, 196, 8192)
    assert (row["predicted"]["blocks_per_sm"], row["whole_file"]["blocks_per_sm"]) == (4, 5)
    assert row["predicted"]["theoretical_occupancy"] == 4 * 2 / 64
    assert abs(row["predicted"]["waves"] - 8192 / 528) < 1e-9 and abs(row["whole_file"]["waves"] - 8192 / 660) < 1e-9


def test_the_comparison_says_which_rule_the_measured_occupancy_follows(tmp_path):
    record = ro.predict()
    for name, registers, achieved, calculator, verdict in [
            ("under", 196, 12.2, 4, "sub-partition"),  # at most 12.5 %: 4 blocks fit
            ("over", 196, 14.9, 5, "whole file"),  # more than 4 blocks' 8 warps were active
            ("agree", 168, 17.8, 6, "the rules agree at these registers")]:  # 5,376 a warp: 6 blocks either way
        ncu_csv(tmp_path / name, registers, achieved, calculator)
        (got,) = ro.compare(tmp_path / name, record)
        assert (got["registers"], got["threads"], got["ncu_blocks"], got["verdict"]) == (
            registers, 64, calculator, verdict), got


def test_the_occupancy_step_is_in_the_second_half_of_call_5():
    assert "occupancy" in halves()["call5b"]
