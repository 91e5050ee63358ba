#!/usr/bin/env bash
# RoPE scaling survives export (issue 37): `oombd run` trains a LoRA adapter on the real
# SmolLM2-135M-Instruct with YaRN (factor 4 over an original window of 2,048 positions, a field
# the export must carry), and transformers + PEFT, loading the checkpoint with exactly the code
# `oombd run` prints, reproduce `oombd model eval`'s loss on a 3K-token held-out Austen text
# (beyond the 2K window, in three chunks) within 1e-3 (float32, CPU). Loaded
# without the recorded config, the same adapter gives another loss (what the test would catch).
# Exit 77 (skipped) without the test data.
# Usage: rope_parity_test.sh OOMBD PYTHON
set -euo pipefail
oombd=$1
python=$2
data="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
model="$data/models/SmolLM2-135M-Instruct"
[ -f "$model/config.json" ] || { echo "skip: no model at $model"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$oombd" data build --model "$model" --tokens 1024 --max-samples 1 "$data/texts/austen/emma.txt" -o "$work/train.jsonl"
"$oombd" data build --model "$model" --tokens 3072 --max-samples 1 "$data/texts/austen/persuasion.txt" \
  -o "$work/eval.jsonl"
cat >"$work/job.yaml" <<YAML
display_name: yarn
model: {path: $model, dtype: float32, rope_scaling: {type: yarn, factor: 4, original_max_position_embeddings: 2048}}
method: {type: lora, lora: {rank: 8, alpha: 16}}
data: {train: $work/train.jsonl, max_seq_len: 1024}
training: {max_steps: 1, learning_rate: 2.0e-3, warmup_steps: 0, lr_schedule: constant}
memory: {chunk_tokens: 512, page_tokens: 128}
checkpoint: {every_steps: 0}
resources: {device: cpu}
YAML
OMP_NUM_THREADS=$(nproc) "$oombd" run "$work/job.yaml" --checkpoint-dir "$work/out" 2>"$work/run.err"
cat "$work/run.err"
# The loading code: the lines after "Load it with".
sed -n '/Load it with/,$p' "$work/run.err" | tail -n +2 >"$work/load.py"
OMP_NUM_THREADS=$(nproc) "$oombd" model eval --model "$model" --adapter "$work/out/final" --data "$work/eval.jsonl" \
  --dtype float32 --device cpu --chunk-tokens 1024 >"$work/eval.json"
cat "$work/eval.json"
OMP_NUM_THREADS=$(nproc) "$python" - "$work" "$model" <<'PY'
import json, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
work, model_dir = sys.argv[1:3]
import torch, transformers, peft
code = open(os.path.join(work, "load.py")).read()
print(code)
scope = {}
exec(code, scope)  # the code oombd run printed, as printed
model, tokenizer = scope["model"].eval(), scope["tokenizer"]
config = model.config
rope = config.rope_parameters
assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0, rope
assert rope["original_max_position_embeddings"] == 2048, rope
assert config.max_position_embeddings == 8192, config.max_position_embeddings
assert next(model.parameters()).dtype == torch.float32
text = json.loads(open(os.path.join(work, "eval.jsonl")).readline())["text"]
ids = tokenizer(text, return_tensors="pt").input_ids
assert ids.shape[1] > 2560, ids.shape  # past the 2,048-token window
with torch.no_grad():
    hf = model(input_ids=ids, labels=ids).loss.item()
oomb = json.load(open(os.path.join(work, "eval.json")))
print(f"3K loss: oombd model eval {oomb['loss']:.6f} over {oomb['tokens']} tokens, transformers + PEFT {hf:.6f}")
assert oomb["tokens"] == ids.shape[1] - 1, (oomb["tokens"], ids.shape)
assert abs(oomb["loss"] - hf) <= 1e-3, abs(oomb["loss"] - hf)
# The same adapter on the base loaded without the recorded config: another model.
plain = peft.PeftModel.from_pretrained(
    transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
    os.path.join(work, "out", "final")).eval()
with torch.no_grad():
    short = ids[:, :1024]
    scaled, unscaled = model(input_ids=short, labels=short).loss.item(), plain(input_ids=short, labels=short).loss.item()
print(f"first 1024 tokens: with the recorded config {scaled:.6f}, without {unscaled:.6f}")
assert abs(scaled - unscaled) > 1e-3, "the recorded config changed nothing: the test could not tell"
PY
echo PASS
