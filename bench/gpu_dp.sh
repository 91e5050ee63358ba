#!/usr/bin/env bash
# Data parallelism on the GPU machine (issue #12): Qwen2.5-7B-shaped model with random bf16
# weights, LoRA r=16 on every linear layer, 128K-token sequences, a global batch of 2
# sequences, trained by `oombd run` on GPUS devices (1: both sequences on one GPU, one after
# the other; 2: one sequence per GPU, gradients all-reduced over NCCL). The same global batch,
# so the loss curves must agree and tokens/s should double.
#
# Usage (through scripts/gpu_run.sh on nvidia-h200-x2): bench/gpu_dp.sh GPUS STEPS
# Output: $OUT/dp-gpus<GPUS>.log and $OUT/metrics-gpus<GPUS>.jsonl. The model is written once
# once (under .bench-work/, git-ignored) and reused by a later call while the machine stays warm.
set -euo pipefail
gpus=${1:?GPUS}
steps=${2:?STEPS}
OUT="${OUT:-/tmp/oomb-out}"
work="${OOMB_DP_WORK:-$PWD/.bench-work/dp}"  # kept between calls while the machine stays warm
seq=131072
if [ ! -f "$work/model/config.json" ]; then
  mkdir -p "$work"
  start=$(date +%s)
  python3 "$(dirname "$0")/make_random_qwen.py" "$work" "$seq" 4 7b
  echo "model written in $(( $(date +%s) - start )) s" | tee -a "$OUT/dp-gpus$gpus.log"
fi
cat >"$work/job-$gpus.yaml" <<YAML
display_name: dp-gpus$gpus
model: {path: $work/model, dtype: bfloat16}
method: {type: lora, lora: {rank: 16, alpha: 32}}
data: {train: $work/train.jsonl, max_seq_len: $seq, shuffle_seed: -1}
training: {max_steps: $steps, batch_sequences: 2, warmup_steps: 0, learning_rate: 1.0e-4}
memory: {chunk_tokens: 4096, page_tokens: 128}
checkpoint: {every_steps: 0}
resources: {device: cuda, gpus: $gpus}
YAML
rm -rf "$work/run-$gpus"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$OUT/dp-gpus$gpus.log"
oombd run "$work/job-$gpus.yaml" --checkpoint-dir "$work/run-$gpus" 2>&1 | tee -a "$OUT/dp-gpus$gpus.log"
cp "$work/run-$gpus/metrics.jsonl" "$OUT/metrics-gpus$gpus.jsonl"
