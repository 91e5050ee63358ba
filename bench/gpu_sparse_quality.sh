#!/usr/bin/env bash
# Quality of sparse attention (issue #6), on the GPU machine through scripts/gpu_run.sh: the real
# SmolLM2-135M-Instruct with YaRN RoPE scaling (x8: 8K -> 64K), LoRA r=16 on every linear layer,
# fine-tuned on 64K-token samples of Jane Austen's novels, once with dense attention and once
# with page-level sparse attention (64 pages of 128: sink 1, local 4, mean key), same seed, same
# data; validation on a held-out 64K-token sample of Persuasion every 5 steps.
#
# The model cannot be downloaded there and is larger than one call may carry: the GGUF of
# scripts/fetch_test_data.sh travels in two earlier calls, split in .stage1/ and .stage2/ and
# copied to /tmp/stage/ (see bench/results/*-sparse/README.md for the exact calls); this script
# joins, checks and converts it (scripts/gguf_to_hf.py, the gguf wheel carried in .qdata/).
# Texts: .qdata/*.txt (Debian r-cran-janeaustenr, as scripts/fetch_test_data.sh extracts them).
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
cat /tmp/stage/smol.gguf.part-* >"$work/smol.gguf"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $work/smol.gguf" | sha256sum -c | tee "$log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .qdata/gguf-*.whl
PYTHONPATH=/tmp/site python3 scripts/gguf_to_hf.py "$work/smol.gguf" "$work/model" 2>&1 | tail -3 | tee -a "$log"
# The tokenizer CI uses (made by the same script with this machine's older transformers: the
# GPU machine's transformers 5.x writes a byte-fallback BPE that oomb's tokenizer does not read).
cp .qdata/tokenizer.json .qdata/tokenizer_config.json "$work/model/"
# Samples of 290,000 characters (at least 64K tokens; truncated to 65,536), whole novels cut in
# order; Persuasion is held out for validation.
python3 - "$work" <<'PY'
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
size = 290_000
def samples(name):
    text = pathlib.Path(".qdata", name).read_text()
    return [text[i:i + size] for i in range(0, len(text) - size + 1, size)]
train = [s for n in ["prideprejudice.txt", "emma.txt", "mansfieldpark.txt", "sensesensibility.txt",
                     "northangerabbey.txt"] for s in samples(n)]
with open(work / "train.jsonl", "w") as f:
    for s in train:
        f.write(json.dumps({"text": s}) + "\n")
with open(work / "val.jsonl", "w") as f:
    f.write(json.dumps({"text": samples("persuasion.txt")[0]}) + "\n")
print(f"{len(train)} training samples, 1 validation sample, {size} characters each")
PY
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
