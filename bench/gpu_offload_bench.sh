#!/usr/bin/env bash
# The host tier of KV pages (issue #5) on the GPU machine, through scripts/gpu_run.sh: the
# Qwen2.5-7B architecture with random bf16 weights, LoRA r=16 on every linear layer, chunks of
# 4096, pages of 128, one training step per length after a warm-up.
#   dense  LENGTHS: each length twice, every page on the GPU (--kv-offload none) and every page
#                   in pinned host memory (--kv-offload host): the step-time difference is the
#                   exposed transfer, and the host runs' GPU peaks give the memory slope.
#   sparse LENGTHS: page-level sparse attention (page_budget 64, sink 1, local 4, mean key) with
#                   --kv-offload auto: what fits on the GPU stays there, the rest goes to the host.
# Usage: bash bench/gpu_offload_bench.sh dense "16384 65536" | sparse "1048576"
#        OOMB_KV_GRAD_DTYPE=bfloat16: bfloat16 KV-gradient pages (memory.kv_grad_dtype)
# Output: $OUT/offload_none.jsonl, $OUT/offload_host.jsonl | $OUT/sparse_auto.jsonl, and
#         $OUT/free.txt (host memory before and after).
set -uo pipefail
OUT="${OUT:-/tmp/oomb-out}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mode=${1:-dense}
lengths=${2:-"16384 65536"}
grad_dtype=${OOMB_KV_GRAD_DTYPE:-float32}
free -g >"$OUT/free.txt"
if [ "$mode" = dense ]; then
  for offload in none host; do
    # shellcheck disable=SC2086
    .carry/bin/bench_train --model qwen2.5-7b --kv-offload "$offload" --kv-grad-dtype "$grad_dtype" --lengths $lengths | tee "$OUT/offload_$offload.jsonl"
  done
else
  # shellcheck disable=SC2086
  .carry/bin/bench_train --model qwen2.5-7b --sparse-budget 64 --kv-offload auto --kv-grad-dtype "$grad_dtype" \
    --lengths $lengths |
    tee "$OUT/sparse_auto.jsonl"
fi
free -g >>"$OUT/free.txt"
