#!/usr/bin/env bash
# Device call 2 (H100): the gpu_bench sweeps. Runs from the root of `git archive <commit>`
# (COMMIT names it), with numpy 2.4 first on PYTHONPATH (see call1.sh); results in $OUT/call2.tgz.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD IOSIM_GIT_COMMIT=$(cat COMMIT)
R=${OUT:?}/call2
B=$R/bench
mkdir -p "$B"
python3 experiments/results/gpu/versions.py > "$R/versions.json" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/gpu_state.csv"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $R/NAME.log, note the status
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" 2>&1 | tee "$R/$name.log" | grep -v Warning | tail -n 40
  echo "$name rc=${PIPESTATUS[0]}" | tee -a "$R/steps.txt"
}
BENCH=(python3 -m experiments.gpu_bench --out "$B")

step smoke 60 env IOSIM_GPU=1 python3 -m pytest tests/test_kernels_bench.py -p no:cacheprovider -q
# targets and the comparison with torch: batch 16, heads 16, fp32
step main 150 "${BENCH[@]}" --impl flash-swapped torch torch-sdpa standard --batch-size 16 --num-heads 16 \
  --emb-dim 1024 2048 --seq-len 512 1024 2048 4096 --causal both --dtype float32 --warmup 1 --repeats 3
# forward+backward memory against N, one batch
step memory 50 "${BENCH[@]}" --impl flash-swapped torch torch-sdpa --batch-size 1 --num-heads 16 --emb-dim 1024 \
  --seq-len 2048 4096 8192 16384 32768 --dtype float32 --warmup 1 --repeats 1
step sdpa_fp16 30 "${BENCH[@]}" --impl torch-sdpa --batch-size 16 --num-heads 16 --emb-dim 1024 2048 \
  --seq-len 512 1024 2048 4096 8192 16384 --causal both --dtype float16 --warmup 1 --repeats 3
step large 170 "${BENCH[@]}" --impl torch torch-sdpa standard flash-swapped --batch-size 16 --num-heads 16 \
  --emb-dim 1024 2048 --seq-len 8192 16384 --causal both --dtype float32 --warmup 1 --repeats 1
step flash 80 "${BENCH[@]}" --impl flash --batch-size 16 --num-heads 16 --emb-dim 1024 2048 \
  --seq-len 512 1024 2048 --causal both --dtype float32 --warmup 1 --repeats 2
tar czf "$OUT/call2.tgz" -C "$OUT" call2 && rm -rf "$R"
