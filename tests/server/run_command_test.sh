#!/usr/bin/env bash
# `oombd run` with an evaluation section, on the tiny test model: a line per step, and after
# every evaluation (every_steps 1, and the last step) a line with its results (here the loss by
# position of data.validation, in its buckets). Then method.type evaluate on the adapter the run
# wrote: no training, and the same results as the evaluation after the last step (the same
# model: the base with that adapter); a spec that also names data.train is refused. Exit 77
# (skipped) without the tiny models.
# Usage: run_command_test.sh OOMBD PYTHON
set -euo pipefail
oombd=$1
python=$2
model="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}/tiny/llama-gqa"
[ -f "$model/config.json" ] || { echo "skip: no model at $model"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - "$work" <<'PY'
import json, random, sys
random.seed(3)
for name, n, length in (("train", 4, 100), ("val", 1, 1500)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": [random.randrange(256) for _ in range(length)]}) + "\n")
PY
cat >"$work/job.yaml" <<YAML
model: {path: $model, dtype: float32}
method: {type: lora, lora: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}}
data: {train: train.jsonl, validation: val.jsonl, max_seq_len: 1536, packing: false}
training: {max_steps: 2, learning_rate: 1.0e-3, warmup_steps: 0}
memory: {chunk_tokens: 256, page_tokens: 64}
checkpoint: {every_steps: 0}
evaluation: {suites: [positions], every_steps: 1}
resources: {device: cpu}
YAML
(cd "$work" && "$oombd" run job.yaml --checkpoint-dir out 2>"$work/err")
cat "$work/err"
grep -q "^step 1/2 loss" "$work/err"
grep -Eq "^evaluation after step 1: loss by position \[0, 1024\) [0-9.]+ \[1024, 2048\) [0-9.]+$" "$work/err"
grep -Eq "^evaluation after step 2: loss by position" "$work/err"
[ "$(grep -c '^evaluation after step' "$work/err")" = 2 ]

cat >"$work/eval.yaml" <<YAML
model: {path: $model, dtype: float32}
method: {type: evaluate, lora: {init_adapter: out/final}}
data: {validation: val.jsonl, max_seq_len: 1536, packing: false}
memory: {chunk_tokens: 256, page_tokens: 64}
evaluation: {suites: [positions]}
resources: {device: cpu}
YAML
(cd "$work" && "$oombd" run eval.yaml --checkpoint-dir eval-out 2>"$work/eval-err")
cat "$work/eval-err"
trained=$(grep '^evaluation after step 2:' "$work/err" | sed 's/^evaluation after step 2://')
evaluated=$(grep '^evaluation:' "$work/eval-err" | sed 's/^evaluation://')
[ -n "$evaluated" ] && [ "$evaluated" = "$trained" ]
last_eval=$(grep '^step 2/2' "$work/err" | sed 's/.* eval //')
grep -qx "validation loss $last_eval" "$work/eval-err"
! grep -q "^step " "$work/eval-err"
[ "$(wc -l <"$work/eval-out/metrics.jsonl")" = 1 ]
[ ! -e "$work/eval-out/final" ]

sed -i 's|^data: {|data: {train: train.jsonl, |' "$work/eval.yaml"
if (cd "$work" && "$oombd" run eval.yaml --checkpoint-dir eval-out2 2>"$work/refused"); then exit 1; fi
cat "$work/refused"
grep -q "data.train: method.type evaluate trains nothing" "$work/refused"
echo PASS
