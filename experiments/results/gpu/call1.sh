#!/usr/bin/env bash
# Device call 1 (H100): the kernel tests on the GPU, compute-sanitizer, ncu DRAM bytes.
# Runs from the root of `git archive <commit>` (COMMIT names it); everything lands in $OUT/call1.tgz.
# The device's numpy 2.5 lacks np.row_stack, which numba-cuda 0.30.4 imports: the caller puts a
# numpy 2.4.6 wheel first on PYTHONPATH (docs/gpu.md says how).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
R=${OUT:?}/call1
mkdir -p "$R"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | tail -1)
{
  date -u; echo "commit $(cat COMMIT)"; nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  python3 experiments/results/gpu/versions.py
  "$NCU" --version; "$SANITIZER" --version
} > "$R/env.txt" 2>&1
cat "$R/env.txt"

timeout 330 env IOSIM_GPU=1 python3 -m pytest tests/test_kernels.py tests/test_kernels_bench.py tests/test_kernels_gpu.py \
  -n 6 -p no:cacheprovider -rA --durations=20 > "$R/pytest_gpu.log" 2>&1 &
PYTEST=$!
for tool in memcheck racecheck; do
  timeout 300 "$SANITIZER" --tool $tool --error-exitcode 3 --print-limit 100 \
    python3 -m experiments.ncu_traffic launch --grid sanitize > "$R/sanitizer_$tool.log" 2>&1 &
  eval "PID_$tool=$!"
done
wait $PYTEST; echo "pytest rc=$?" | tee -a "$R/steps.txt"
wait $PID_memcheck; echo "memcheck rc=$?" | tee -a "$R/steps.txt"
wait $PID_racecheck; echo "racecheck rc=$?" | tee -a "$R/steps.txt"

timeout 200 env NCU="$NCU" python3 -m experiments.ncu_traffic profile --grid traffic --out "$R/ncu" > "$R/ncu.log" 2>&1
echo "ncu rc=$?" | tee -a "$R/steps.txt"

tail -n 25 "$R/pytest_gpu.log"; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$R"/sanitizer_*.log; tail -n 5 "$R/ncu.log"
tar czf "$OUT/call1.tgz" -C "$OUT" call1 && rm -rf "$R"
