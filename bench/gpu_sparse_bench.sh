#!/usr/bin/env bash
# Sparse-attention throughput (issue #6) on the GPU machine through scripts/gpu_run.sh:
# Qwen2.5-7B architecture, random bf16 weights, LoRA r=16 on every linear layer, page_budget 64
# of pages of 128 (sink 1, local 4, mean key), one training step per length after a warm-up,
# and the dense step at the first length for comparison. KV and KV-gradient pages are all on the
# GPU (bench_train's default --kv-offload none), so the page pools bound the longest context; the
# host tier's runs (--kv-offload auto) are the bench_train commands in README.md.
# Usage: bash bench/gpu_sparse_bench.sh "LENGTHS" ["DENSE_LENGTHS" | -]   (-: no dense run)
#        OOMB_SPARSE_SELECTION=min_max: Quest's min/max summaries instead of the mean key
# Output: $OUT/sparse_bench[_min_max].jsonl, $OUT/dense_bench.jsonl
set -uo pipefail
OUT="${OUT:-/tmp/oomb-out}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
lengths=${1:-"131072 524288"}
dense_lengths=${2:-"131072"}
selection=${OOMB_SPARSE_SELECTION:-mean_key}
out="$OUT/sparse_bench.jsonl"
[ "$selection" = mean_key ] || out="$OUT/sparse_bench_$selection.jsonl"
# shellcheck disable=SC2086
.carry/bin/bench_train --model qwen2.5-7b --sparse-budget 64 --selection "$selection" --lengths $lengths | tee "$out"
if [ "$dense_lengths" != - ]; then
  # shellcheck disable=SC2086
  .carry/bin/bench_train --model qwen2.5-7b --lengths $dense_lengths | tee "$OUT/dense_bench.jsonl"
fi
