#!/usr/bin/env bash
# Device call 3 (H100): the short prioritized script (issue 28, item 5; issue 29), in two halves of at most 5 minutes,
# one device call each, most decisive first. `python -m experiments.call3_short` is its dry run: each ncu row with the
# DRAM bytes read predicted before the run under both schedules, and each step's time limit.
#   first:  ncu DRAM bytes of the short grid's first part (short-schedule: 12 rows where the committed lockstep and
#           staggered predictions part by 1.35× to 460×), the block-timing probe (experiments/block_trace.py), then
#           the short grid's second part (short-rest, 14 rows) in the time left;
#   second: timings of flash-swapped float32, flash-swapped-tc float16/bfloat16, SDPA's flash backend and torch eager,
#           forward and backward (experiments/gpu_bench.py); the kernel tests on the GPU beside compute-sanitizer
#           memcheck and racecheck on one launch of each kernel; the L2 capacity curve (experiments/l2_capacity.py).
# Each step works in /tmp/call3/<half> and is packed into $OUT/<half>-<step>.tgz as soon as it ends, so a cut call
# returns what finished, in at most 8 files.
#   rest-first, rest-second: what call 3 (2026-11-27) did not reach, for the next call: short-rest's 14 rows, one
#           ncu process per kernel build so that a cut keeps the groups that finished; the kernel tests with -v (which
#           names the 8 that failed); then SDPA's flash backend under ncu (call3-sdpa: 22 rows, predicted before the
#           run in predictions-96a5261 and -96a5261-staggered); the 4 sanitizer launches not reached; timings at
#           d 128, in bfloat16, causal (flash-swapped's float32 at d 128 left out for time).
#   call5: what call 4 (2026-11-27, docs/gpu-logs/2026-11-27-h100-call4.md) left, in one call: the GPU tests it
#           found failing, as fixed since (the mma and ldmatrix probes, split-kv's large cases) and the rest of
#           test_kernels_gpu.py, which its time limit cut; SDPA's causal forward at d = 128 across N and heads
#           (call5-sdpa: 9 rows, predicted before the run in predictions-5217ccf, -staggered, -timed-call5-sdpa);
#           flash-swapped float32 at d = 128 against torch eager, the timing calls 3 and 4 left out.
#   call5b: a second half for the same call: SDPA's split-KV forward, where torch splits K/V (decoding and short
#           prefills of few heads; call5-split: 5 rows, each kernel apart, predicted before the run in the
#           predictions files experiments/call3_short.py names); then what iosim's kernels read beyond their
#           tensors, their code (call5-code: 11 small rows, each kernel apart, predicted with their code before the
#           run in predictions-<commit>-code.json: experiments/code_bytes.py --predict); last, ncu's occupancy of
#           flash's backward over 8,192 blocks of 2 warps (call5-occupancy: whether registers go to sub-partitions,
#           predicted before the run in predictions-<commit>-occupancy.json: experiments/register_occupancy.py).
# The first call-3 parts stay available by name (call3, call3-swapped, call3-tc, call3-backward, call3-tc-backward,
# call3-gqa, call3-split-kv, call3-sawtooth: 388 rows, predictions-80f2354.json and the files it names).
#
# Usage, from the repository's root on the device (IOSIM_GIT_COMMIT names the commit the tree is):
#   IOSIM_GIT_COMMIT=<commit> bash experiments/results/gpu/call3.sh first|second|rest-first|rest-second|call5|call5b|<grid>
# The device's numpy 2.5 lacks np.row_stack, which numba-cuda 0.30.4 imports: a numpy 2.4.6 wheel is carried in .whl
# and installed to /tmp/site, first on PYTHONPATH (docs/gpu.md). iosim.kernels is kernels/ (pyproject's package-dir):
# the disposable device copy links it into iosim/ so that the tree imports without an install.
set -o pipefail
PART=${1:-first}
: "${OUT:?}"
R=/tmp/call3/$PART
mkdir -p "$R"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -e iosim/kernels ] || ln -s ../kernels iosim/kernels
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export IOSIM_GIT_COMMIT=${IOSIM_GIT_COMMIT:?name the commit this tree is: the device copy may carry another .git}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer | tail -1)
{
  date -u; echo "commit $IOSIM_GIT_COMMIT"; echo "part $PART"; nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.memory,power.limit --format=csv
  python3 experiments/results/gpu/versions.py
  "$NCU" --version; "$SANITIZER" --version
} > "$OUT/$PART-env.txt" 2>&1
head -n 3 "$OUT/$PART-env.txt"

pack() {  # pack NAME: $R/NAME* into $OUT/$PART-NAME.tgz
  tar czf "$OUT/$PART-$1.tgz" -C "$R" $(cd "$R" && ls -d "$1"*) && echo "packed $PART-$1.tgz"
}
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $R/NAME.log, note the status and the time
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  timeout "$limit" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$R/steps.txt"
  tail -n 4 "$R/$name.log"
}
ncu_grid() {  # ncu_grid GRID SECONDS [--grouped]: ncu DRAM bytes of a grid of experiments/ncu_traffic.py
  step "ncu-$1" "$2" env NCU="$NCU" python3 -m experiments.ncu_traffic profile --grid "$1" --out "$R/ncu-$1" "${@:3}"
  pack "ncu-$1"
}

case $PART in
  first)
    ncu_grid short-schedule 160
    step trace 75 python3 -m experiments.block_trace --out "$R/trace"
    pack trace
    ncu_grid short-rest 75
    ;;
  second)
    B=(python3 -m experiments.gpu_bench --out "$R/bench" --batch-size 16 --num-heads 16 --seq-len 4096
       --emb-dim 1024 2048 --warmup 1 --repeats 3)
    step bench-16bit 45 "${B[@]}" --impl flash-swapped-tc torch-sdpa --dtype float16 bfloat16
    step bench-fp32 55 "${B[@]}" --impl flash-swapped torch --dtype float32
    S=(python3 -m experiments.gpu_bench --out "$R/bench" --batch-size 2 --num-heads 16 --emb-dim 1024
       --seq-len 1024 2048 4096 8192 16384 --warmup 1 --repeats 3)
    step bench-scan-fp32 20 "${S[@]}" --impl flash-swapped torch --dtype float32
    step bench-scan-16bit 20 "${S[@]}" --impl flash-swapped-tc torch-sdpa --dtype float16
    pack bench
    SAN=(python3 -m experiments.ncu_traffic launch --grid sanitize)
    step memcheck 130 "$SANITIZER" --tool memcheck --error-exitcode 3 --print-limit 100 "${SAN[@]}" &
    step racecheck 130 "$SANITIZER" --tool racecheck --error-exitcode 3 --print-limit 100 "${SAN[@]}" &
    step pytest 130 env IOSIM_GPU=1 python3 -m pytest tests/test_kernels.py tests/test_kernels_split_kv.py \
      tests/test_kernels_bench.py tests/test_kernels_gpu.py -n 10 -p no:cacheprovider -v -rA --durations=20
    wait
    pack memcheck; pack racecheck; pack pytest
    step l2 20 python3 -m experiments.l2_capacity --out "$R/l2"
    step l2-ncu 20 "$NCU" --metrics dram__bytes_read.sum --cache-control none --profile-from-start off --csv \
      --print-units base --log-file "$R/l2/ncu.csv" python3 -m experiments.l2_capacity --out "$R/l2" --profile
    pack l2
    ;;
  rest-first)  # what call 3 left (docs/gpu-logs/2026-11-27-h100-call3.md), one ncu process per kernel build
    ncu_grid short-rest 200 --grouped
    step pytest 110 env IOSIM_GPU=1 python3 -m pytest tests/test_kernels.py tests/test_kernels_split_kv.py \
      tests/test_kernels_bench.py tests/test_kernels_gpu.py -n 10 -p no:cacheprovider -v -rA --durations=20
    pack pytest
    ;;
  rest-second)
    ncu_grid call3-sdpa 70 --grouped
    SAN=(python3 -m experiments.ncu_traffic launch --grid sanitize --only 18 19 20 21)
    step memcheck 60 "$SANITIZER" --tool memcheck --error-exitcode 3 --print-limit 100 "${SAN[@]}" &
    step racecheck 60 "$SANITIZER" --tool racecheck --error-exitcode 3 --print-limit 100 "${SAN[@]}" &
    wait
    pack memcheck; pack racecheck
    B=(python3 -m experiments.gpu_bench --out "$R/bench" --batch-size 16 --num-heads 16 --seq-len 4096
       --warmup 1 --repeats 2)
    step bench-d128 70 "${B[@]}" --emb-dim 2048 --impl flash-swapped-tc torch-sdpa --dtype float16
    step bench-bf16 45 "${B[@]}" --emb-dim 1024 --impl flash-swapped-tc torch-sdpa --dtype bfloat16
    step bench-causal 45 "${B[@]}" --emb-dim 1024 --impl flash-swapped-tc torch-sdpa --dtype float16 --causal true
    pack bench
    ;;
  call5)
    step pytest 180 env IOSIM_GPU=1 python3 -m pytest tests/test_kernels_gpu.py tests/test_kernels.py \
      -k "gpu or mma_16816 or ldmatrix" -n 10 -p no:cacheprovider -v -rA --durations=20
    pack pytest
    ncu_grid call5-sdpa 60 --grouped
    step bench-fp32-d128 45 python3 -m experiments.gpu_bench --out "$R/bench" --batch-size 2 --num-heads 16 \
      --seq-len 4096 --emb-dim 2048 --warmup 1 --repeats 2 --impl flash-swapped torch --dtype float32
    pack bench
    ;;
  call5b)
    ncu_grid call5-split 60 --grouped
    ncu_grid call5-code 150 --grouped
    mkdir -p "$R/occupancy"
    step occupancy 45 "$NCU" --section LaunchStats --section Occupancy --csv --profile-from-start off \
      --log-file "$R/occupancy/ncu.csv" python3 -m experiments.ncu_traffic launch --grid call5-occupancy
    pack occupancy
    ;;
  *)
    ncu_grid "$PART" 560
    ;;
esac
cp "$R/steps.txt" "$OUT/$PART-steps.txt"
