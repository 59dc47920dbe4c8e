#!/usr/bin/env bash
# Device call 3 (H100): ncu DRAM bytes of exactly the configurations whose DRAM bytes were predicted before it.
# The default grid, call3, is 388 rows (issue 17, items 4 and 5), each part predicted in its own file:
# - experiments/results/gpu/predictions-80f2354.json: the first 240, the forward of flash-swapped (float32, float16)
#   and flash-swapped-tc (float16, bfloat16), 176 rows, then the backward of flash-swapped (float32, float16), 64;
# - predictions-6d16ff6.json (grid call3-tc-backward): the backward of flash-swapped-tc (float16, bfloat16), 64 rows;
# - predictions-bda8144.json (grid call3-gqa): flash-swapped's forward with grouped heads (32 over 8 and over 1),
#   float16, 20 rows;
# - predictions-69c24cc.json (grid call3-split-kv): split-kv decoding, its split kernel and its combine, float16,
#   40 rows;
# - predictions-159b338.json (grid call3-sawtooth): flash-swapped's forward in both K/V orders, float16, 24 rows;
# and every row again with the first blocks started staggered: predictions-92a2cc8-staggered.json (the first 364)
# and predictions-159b338-staggered.json (call3-sawtooth).
# Usage: bash experiments/results/gpu/call3.sh [call3 | call3-swapped | call3-tc | call3-backward | call3-tc-backward
#                                               | call3-gqa | call3-split-kv | call3-sawtooth]
# The seven parts (88, 88, 64, 64, 20, 40 and 24 rows) can run as separate device commands if one exceeds the 10-minute
# limit; each row carries its full configuration, so the parts join the predictions on impl, direction,
# dtype, batch, heads, kv_heads, N, d, causal, splits, sawtooth (configs.json beside ncu.csv), not on the index.
# Runs from the root of `git archive <commit>` (COMMIT names it); everything lands in $OUT/<grid>.tgz.
# The device's numpy 2.5 lacks np.row_stack, which numba-cuda 0.30.4 imports: the caller puts a
# numpy 2.4.6 wheel first on PYTHONPATH (docs/gpu.md says how).
set -o pipefail
GRID=${1:-call3}
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
R=${OUT:?}/$GRID
mkdir -p "$R"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
{
  date -u; echo "commit $(cat COMMIT 2>/dev/null || git rev-parse HEAD)"; echo "grid $GRID"; nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  python3 experiments/results/gpu/versions.py
  "$NCU" --version
} > "$R/env.txt" 2>&1
cat "$R/env.txt"

# ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum --cache-control all (ncu_traffic.ncu_command)
timeout 560 env NCU="$NCU" python3 -m experiments.ncu_traffic profile --grid "$GRID" --out "$R/ncu" > "$R/ncu.log" 2>&1
echo "ncu rc=$?" | tee -a "$R/steps.txt"

tail -n 5 "$R/ncu.log"
tar czf "$OUT/$GRID.tgz" -C "$OUT" "$GRID" && rm -rf "$R"
