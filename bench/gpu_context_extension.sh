#!/usr/bin/env bash
# A context extension shown to work (issue 37, item 3), on the GPU machine through
# scripts/gpu_run.sh: the real SmolLM2-135M-Instruct (native window 8,192) extended to 64K with
# YaRN (factor 8), LoRA r=16 on every linear layer, bf16, trained on 65,536-token samples of five
# Austen novels and evaluated on Persuasion, held out from training (bench/gpu_smollm2.sh):
#   before  the base model, with its native RoPE and with the YaRN scaling the runs train with
#           (`oombd model eval --rope-scaling`): $OUT/ext_before_{native,yarn}.json;
#   hf      the same recipe at 32K tokens, STEPS steps, trained by oomb and by transformers +
#           PEFT (bench/hf_context_extension.py) from one PEFT-initialised adapter, samples in file
#           order: $OUT/ext_hf_oomb.jsonl (oomb's metrics.jsonl), $OUT/ext_hf_peft.jsonl;
#   dense | sparse   `oombd run` of STEPS steps with the job's evaluation section at the end
#           (each run evaluates with its own attention): $OUT/ext_{dense,sparse}.jsonl (the
#           run's metrics.jsonl; the last line holds the evaluation) and the run's log.
#           With MIX "mixed": the training data also holds the retrieval suites' documents
#           (`oombd data retrieval`, seed 1000, not the evaluation's 1: passkey, and needle in
#           Emma, never Persuasion; the 4 lengths x 9 depths each), shuffled with the novels:
#           $OUT/ext_{dense,sparse}_mixed.jsonl.
# Every evaluation: loss by position on the held-out 64K sample (buckets doubling from 1K),
# passkey and needle (a key->value fact in Persuasion's text) at 8K, 16K, 32K and 64K tokens x 5
# depths x 2 trials, seed 1, scored by exact match of the greedy answer.
# Usage: bash bench/gpu_context_extension.sh before|hf|dense|sparse [STEPS (default 40)] [MIX]
# Plots and table: bench/plot_context_extension.py.
set -euo pipefail
OUT="${OUT:-/tmp/oomb-out}"
what=$1
STEPS="${2:-40}"
MIX="${3:-}"
work=/tmp/oomb-extension
mkdir -p "$work"
tag=$what${MIX:+_$MIX}
log="$OUT/ext_$tag.log"
: >"$log"
source bench/gpu_smollm2.sh
yarn='{type: yarn, factor: 8.0, original_max_position_embeddings: 8192}'

# run_job NAME METRICS: `oombd run $work/NAME.yaml` into $work/run-NAME, its time logged, its
# metrics.jsonl copied to METRICS.
run_job() {
  echo "== oombd run ($1, $STEPS steps)" | tee -a "$log"
  rm -rf "$work/run-$1"
  local start
  start=$(date +%s)
  oombd run "$work/$1.yaml" --checkpoint-dir "$work/run-$1" 2>&1 | tail -n 40 | tee -a "$log"
  echo "$1: $(($(date +%s) - start)) s for training and evaluation" | tee -a "$log"
  cp "$work/run-$1/metrics.jsonl" "$2"
}
lengths="8192 16384 32768 65536"
if [ "$what" = before ]; then
  for scaling in native yarn; do
    rope=()
    [ "$scaling" = yarn ] && rope=(--rope-scaling "$yarn")
    echo "== oombd model eval ($scaling RoPE)" | tee -a "$log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    oombd model eval --model "$work/model" "${rope[@]}" --dtype bfloat16 --device cuda --chunk-tokens 8192 \
      --suite positions --data "$work/val.jsonl" --suite passkey --suite needle --haystack "$work/persuasion.txt" \
      --lengths $lengths --depths 5 --trials 2 --seed 1 >"$OUT/ext_before_$scaling.json" 2>>"$log"
    echo "$scaling: $(($(date +%s) - start)) s" | tee -a "$log"
    tee -a "$log" <"$OUT/ext_before_$scaling.json"
  done
  exit 0
fi
if [ "$what" = hf ]; then
  python3 bench/hf_context_extension.py init --model "$work/model" --out "$work/init_adapter" 2>&1 | tail -2 | tee -a "$log"
  cat >"$work/hf.yaml" <<YAML
display_name: austen-32k-oomb-vs-peft
model: {path: $work/model, dtype: bfloat16, rope_scaling: $yarn}
method: {type: lora, lora: {rank: 16, alpha: 32, init_adapter: $work/init_adapter}}
data: {train: $work/train.jsonl, validation: $work/val.jsonl, max_seq_len: 32768, packing: false, shuffle_seed: -1}
training: {max_steps: $STEPS, learning_rate: 5.0e-4, warmup_steps: 2, seed: 42}
memory: {chunk_tokens: 4096, page_tokens: 128}
checkpoint: {every_steps: 0}
resources: {device: cuda}
YAML
  run_job hf "$OUT/ext_hf_oomb.jsonl"
  echo "== transformers + PEFT (32K, $STEPS steps)" | tee -a "$log"
  start=$(date +%s)
  python3 bench/hf_context_extension.py train --model "$work/model" --config "$work/run-hf/final/base_config.json" \
    --init "$work/init_adapter" --train "$work/train.jsonl" --val "$work/val.jsonl" --length 32768 --steps "$STEPS" \
    --lr 5e-4 --warmup 2 >"$OUT/ext_hf_peft.jsonl" 2>>"$log"
  echo "transformers + PEFT: $(($(date +%s) - start)) s" | tee -a "$log"
  tail -n 2 "$OUT/ext_hf_peft.jsonl" | tee -a "$log"
  exit 0
fi
train="$work/train.jsonl"
if [ "$MIX" = mixed ]; then
  for suite in passkey needle; do
    # shellcheck disable=SC2086  # $lengths: one flag, several values
    oombd data retrieval --model "$work/model" --suite "$suite" --haystack "$PWD/.qdata/emma.txt" --lengths $lengths \
      --depths 9 --seed 1000 -o "$work/$suite-train.jsonl" | tee -a "$log"
  done
  cat "$work/train.jsonl" "$work/passkey-train.jsonl" "$work/needle-train.jsonl" >"$work/train-mixed.jsonl"
  train="$work/train-mixed.jsonl"
fi
cat >"$work/$tag.yaml" <<YAML
display_name: austen-64k-extension-$tag
model:
  path: $work/model
  dtype: bfloat16
  rope_scaling: $yarn
method: {type: lora, lora: {rank: 16, alpha: 32}}
data: {train: $train, validation: $work/val.jsonl, max_seq_len: 65536, packing: false}
training: {max_steps: $STEPS, learning_rate: 5.0e-4, warmup_steps: 2, seed: 42}
memory: {chunk_tokens: 4096, page_tokens: 128}
attention:
  mode: $what
  sparse: {page_budget: 64, sink_pages: 1, local_pages: 4, selection: mean_key}
evaluation:
  suites: [positions, passkey, needle]
  every_steps: $STEPS
  lengths: [${lengths// /, }]
  depths: 5
  trials: 2
  seed: 1
  haystack: $work/persuasion.txt
checkpoint: {every_steps: 0}
resources: {device: cuda}
YAML
run_job "$tag" "$OUT/ext_$tag.jsonl"
