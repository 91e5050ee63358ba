#!/usr/bin/env bash
# Runs on the GPU machine (through scripts/gpu_run.sh): oomb's training-step benchmark and the
# HF baseline (bench/peers/hf_baseline.py) in the same call, so ratios compare like with like.
# Output: $OUT/bench_train.jsonl, $OUT/hf_baseline.jsonl.
# Usage: bash bench/run_train_bench.sh "OOMB_ARGS" "HF_LENGTHS"
set -uo pipefail
OUT="${OUT:-/tmp/oomb-out}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
oomb_args=${1:-"--model qwen2.5-7b --lengths 16384 65536 131072"}
hf_lengths=${2:-"16384 32768 65536"}
echo "== bench_train $oomb_args"
# shellcheck disable=SC2086
.carry/bin/bench_train $oomb_args | tee "$OUT/bench_train.jsonl"
if [ -n "$hf_lengths" ]; then
  echo "== hf_baseline --lengths $hf_lengths"
  # shellcheck disable=SC2086
  python3 bench/peers/hf_baseline.py --lengths $hf_lengths 2>"$OUT/hf_baseline.err" | tee "$OUT/hf_baseline.jsonl"
fi
