#!/usr/bin/env bash
# Quality of sparse attention (issue #6), on the GPU machine through scripts/gpu_run.sh: the real
# SmolLM2-135M-Instruct with YaRN RoPE scaling (x8: 8K -> 64K), LoRA r=16 on every linear layer,
# fine-tuned on 64K-token samples of Jane Austen's novels, once with dense attention and once
# with page-level sparse attention (64 pages of 128: sink 1, local 4, mean key), same seed, same
# data; validation on a held-out 64K-token sample of Persuasion every 5 steps.
#
# The model and the samples: bench/gpu_smollm2.sh (the GGUF staged in /tmp/stage by two
# earlier calls; texts and the gguf wheel in .qdata/).
# Output: $OUT/quality_{dense,sparse}.jsonl (each run's metrics.jsonl; quality_sparse_min_max.jsonl
# with OOMB_QUALITY_SELECTION=min_max; quality_sparse_p256_b32.jsonl and quality_dense_p256.jsonl
# with OOMB_QUALITY_PAGE=256 OOMB_QUALITY_BUDGET=32), $OUT/quality.log. OOMB_QUALITY_MODES picks the runs.
set -euo pipefail
OUT="${OUT:-/tmp/oomb-out}"
STEPS="${OOMB_QUALITY_STEPS:-20}"
MODES="${OOMB_QUALITY_MODES:-dense sparse}"            # which runs
SELECTION="${OOMB_QUALITY_SELECTION:-mean_key}"        # sparse page summaries: mean_key | min_max
PAGE="${OOMB_QUALITY_PAGE:-128}"                       # page_tokens (every run)
BUDGET="${OOMB_QUALITY_BUDGET:-64}"                    # sparse page_budget
work=/tmp/oomb-quality
mkdir -p "$work"
log="$OUT/quality.log"
: >"$log"
source bench/gpu_smollm2.sh  # $work/model, $work/train.jsonl, $work/val.jsonl
for mode in $MODES; do
  tag=$mode
  [ "$mode" = sparse ] && [ "$SELECTION" != mean_key ] && tag="sparse_$SELECTION"
  if [ "$PAGE" != 128 ]; then tag="${tag}_p$PAGE"; fi
  if [ "$mode" = sparse ] && [ "$BUDGET" != 64 ]; then tag="${tag}_b$BUDGET"; fi
  cat >"$work/$mode.yaml" <<YAML
display_name: austen-64k-$mode
model:
  path: $work/model
  dtype: bfloat16
  rope_scaling: {type: yarn, factor: 8.0, original_max_position_embeddings: 8192}
method: {type: lora, lora: {rank: 16, alpha: 32}}
data: {train: $work/train.jsonl, validation: $work/val.jsonl, max_seq_len: 65536, packing: false}
training: {max_steps: $STEPS, learning_rate: 2.0e-4, warmup_steps: 2, eval_every_steps: 5, seed: 42}
memory: {chunk_tokens: 4096, page_tokens: $PAGE}
attention:
  mode: $mode
  sparse: {page_budget: $BUDGET, sink_pages: 1, local_pages: 4, selection: $SELECTION}
checkpoint: {every_steps: 0}
resources: {device: cuda}
YAML
  echo "== oombd run ($mode)" | tee -a "$log"
  rm -rf "$work/run-$tag"
  oombd run "$work/$mode.yaml" --checkpoint-dir "$work/run-$tag" 2>&1 | tail -n 30 | tee -a "$log"
  cp "$work/run-$tag/metrics.jsonl" "$OUT/quality_$tag.jsonl"
done
