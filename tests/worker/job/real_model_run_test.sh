#!/usr/bin/env bash
# `oombd run` fine-tunes the real SmolLM2-135M-Instruct on one 16K-token Austen sample (chunks
# of 2048, pages of 128: the sequence is 8 chunks) on the CPU for one optimizer step (15-20
# minutes on 2 cores: dense attention over 16K tokens dominates): metrics.jsonl has the step,
# and the final adapter loads in PEFT and lowers the loss on its training text. Exit 77
# (skipped) without the test data.
# Usage: real_model_run_test.sh OOMBD PYTHON
set -euo pipefail
oombd=$1
python=$2
data="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
model="$data/models/SmolLM2-135M-Instruct"
[ -f "$model/config.json" ] || { echo "skip: no model at $model"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$oombd" data build --model "$model" --tokens 16384 --max-samples 1 "$data/texts/austen/persuasion.txt" \
  -o "$work/austen.jsonl"
cat >"$work/job.yaml" <<YAML
display_name: austen-16k
model: {path: $model, dtype: float32}
method: {type: lora, lora: {rank: 8, alpha: 16}}
data: {train: $work/austen.jsonl, max_seq_len: 16384}
training: {max_steps: 1, learning_rate: 2.0e-3, warmup_steps: 0, lr_schedule: constant}
memory: {chunk_tokens: 2048, page_tokens: 128}
checkpoint: {every_steps: 0}
resources: {device: cpu}
YAML
# ctest runs this test alone (RUN_SERIAL): use every core, whatever the suite's
# OMP_NUM_THREADS.
OMP_NUM_THREADS=$(nproc) "$oombd" run "$work/job.yaml" --checkpoint-dir "$work/out"
"$python" - "$work/out" "$model" "$work/austen.jsonl" <<'PY'
import json, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
out, model_dir, data = sys.argv[1:4]
steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
assert len(steps) == 1, steps
tokens = steps[0]["tokens"]
print("tokens", tokens, "loss", steps[0]["loss"], "seconds", steps[0]["seconds"])
assert tokens >= 16000, f"sequence of {tokens} tokens, expected about 16K"
import torch, transformers, peft
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
ids = tok(json.loads(open(data).readline())["text"], return_tensors="pt").input_ids[:, :512]
with torch.no_grad():
    before = base(input_ids=ids, labels=ids).loss.item()
    tuned = peft.PeftModel.from_pretrained(base, os.path.join(out, "final"))
    after = tuned(input_ids=ids, labels=ids).loss.item()
print(f"PEFT: loss on the first 512 tokens {before:.4f} -> {after:.4f}")
assert after < before - 1e-3, "the adapter loaded in PEFT does not lower the loss on its training text"
PY
echo PASS
