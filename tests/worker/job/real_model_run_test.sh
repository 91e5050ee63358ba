#!/usr/bin/env bash
# `oombd run` fine-tunes the real SmolLM2-135M-Instruct on one Austen sample of TOKENS tokens
# (8 chunks, pages of 128) for one optimizer step on DEVICE: metrics.jsonl has the step, and the
# final adapter loads in PEFT and lowers the loss on its training text; its trainer_state.json
# loads as transformers' TrainerState with that loss, and its README.md as the Hugging Face Hub's
# ModelCard naming the base model, with the loading code and the spec. Exit 77 (skipped)
# without the test data, or on cuda without a GPU.
# Usage: real_model_run_test.sh OOMBD PYTHON [TOKENS (4096)] [DEVICE cpu|cuda (cpu)]
set -euo pipefail
oombd=$1
python=$2
tokens=${3:-4096}
device=${4:-cpu}
chunk=$((tokens / 8))
data="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
model="$data/models/SmolLM2-135M-Instruct"
[ -f "$model/config.json" ] || { echo "skip: no model at $model"; exit 77; }
if [ "$device" = cuda ] && ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "skip: no GPU"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$oombd" data build --model "$model" --tokens "$tokens" --max-samples 1 "$data/texts/austen/persuasion.txt" \
  -o "$work/austen.jsonl"
cat >"$work/job.yaml" <<YAML
display_name: austen-$tokens
model: {path: $model, dtype: float32}
method: {type: lora, lora: {rank: 8, alpha: 16}}
data: {train: $work/austen.jsonl, max_seq_len: $tokens}
training: {max_steps: 1, learning_rate: 2.0e-3, warmup_steps: 0, lr_schedule: constant}
memory: {chunk_tokens: $chunk, page_tokens: 128}
checkpoint: {every_steps: 0}
resources: {device: $device}
YAML
# ctest runs this test alone (RUN_SERIAL): use every core, whatever the suite's
# OMP_NUM_THREADS.
OMP_NUM_THREADS=$(nproc) "$oombd" run "$work/job.yaml" --checkpoint-dir "$work/out"
"$python" - "$work/out" "$model" "$work/austen.jsonl" "$tokens" <<'PY'
import json, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
out, model_dir, data = sys.argv[1:4]
target = int(sys.argv[4])
steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
assert len(steps) == 1, steps
tokens = steps[0]["tokens"]
print("tokens", tokens, "loss", steps[0]["loss"], "seconds", steps[0]["seconds"])
assert 0.9 * target <= tokens <= target, f"sequence of {tokens} tokens, expected 90-100% of {target} (data build's min_fill)"
import torch, transformers, peft
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
ids = tok(json.loads(open(data).readline())["text"], return_tensors="pt").input_ids[:, :512]
with torch.no_grad():
    before = base(input_ids=ids, labels=ids).loss.item()
    tuned = peft.PeftModel.from_pretrained(base, os.path.join(out, "final"))
    after = tuned(input_ids=ids, labels=ids).loss.item()
print(f"PEFT: loss on the first 512 tokens {before:.4f} -> {after:.4f}")
# The checkpoint's trainer_state.json is Hugging Face's TrainerState, its log the run's loss.
from transformers.trainer_callback import TrainerState
state = TrainerState.load_from_json(os.path.join(out, "final", "trainer_state.json"))
assert state.global_step == 1 and state.log_history[0]["loss"] == steps[0]["loss"], state
assert state.total_flos == steps[0]["model_flops"] > 0, state
print("trainer_state.json: global_step", state.global_step, "loss", state.log_history[0]["loss"])
# Its model card, as the Hugging Face Hub's client reads it.
from huggingface_hub import ModelCard
card = ModelCard.load(os.path.join(out, "final", "README.md"))
assert card.data.base_model == model_dir and card.data.library_name == "peft", card.data
assert "PeftModel.from_pretrained" in card.text and f"display_name: austen-{target}" in card.text, card.text
print("README.md: base_model", card.data.base_model, "tags", card.data.tags)
assert after < before - 1e-3, "the adapter loaded in PEFT does not lower the loss on its training text"
PY
echo PASS
