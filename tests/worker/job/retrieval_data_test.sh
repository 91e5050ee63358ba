#!/usr/bin/env bash
# `oombd data retrieval` on the real SmolLM2 tokenizer: one line per (length, depth, trial), each
# exactly its length, the loss on the answer only (the last tokens: a 5-digit pass key, a
# 7-digit magic number) and the same documents for the same seed, other keys for another;
# RULER's tasks' documents, each line marked with the generator that made it.
# Relative paths work. Exit 77 (skipped) without the test data.
# Usage: retrieval_data_test.sh OOMBD PYTHON
set -euo pipefail
oombd=$1
python=$2
data="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
model="$data/models/SmolLM2-135M-Instruct"
[ -f "$model/tokenizer.json" ] || { echo "skip: no model at $model"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$oombd" data retrieval --model "$model" --suite passkey --lengths 300 600 --depths 3 --trials 2 --seed 7 -o "$work/a.jsonl"
"$oombd" data retrieval --model "$model" --suite passkey --lengths 300 600 --depths 3 --trials 2 --seed 7 -o "$work/b.jsonl"
"$oombd" data retrieval --model "$model" --suite passkey --lengths 300 600 --depths 3 --trials 2 --seed 8 -o "$work/c.jsonl"
"$oombd" data retrieval --model "$model" --suite needle --haystack "$data/texts/austen/emma.txt" --lengths 400 \
  --depths 2 --seed 7 -o "$work/n.jsonl"
"$oombd" data retrieval --model "$model" --suite ruler --tasks niah_single_1 vt --lengths 2048 --samples 2 --seed 7 \
  -o "$work/r.jsonl"
cmp "$work/a.jsonl" "$work/b.jsonl"
# Relative paths are taken against the current directory.
(cd "$work" && "$oombd" data retrieval --model "$model" --suite passkey --lengths 300 600 --depths 3 --trials 2 \
  --seed 7 -o rel.jsonl)
cmp "$work/a.jsonl" "$work/rel.jsonl"
if "$oombd" data retrieval --model "$model" --suite needle --lengths 400 --seed 7 -o "$work/x.jsonl" 2>"$work/err"; then
  echo "FAIL: needle without a haystack was accepted"; exit 1
fi
grep -q -- "--haystack: required" "$work/err"
"$python" - "$work" "$model" <<'PY'
import json, sys
from tokenizers import Tokenizer
work, model = sys.argv[1:3]
tok = Tokenizer.from_file(model + "/tokenizer.json")
def answers(name, lengths, digits):
    out = []
    for line, length in zip(open(f"{work}/{name}"), lengths):
        d = json.loads(line)
        ids, labels = d["input_ids"], d["labels"]
        assert len(ids) == len(labels) == length, (len(ids), len(labels), length)
        labeled = [i for i, l in enumerate(labels) if l != -100]
        assert labeled and labeled == list(range(length - len(labeled), length)), labeled
        assert all(labels[i] == ids[i] for i in labeled)
        answer = tok.decode([ids[i] for i in labeled]).strip()
        assert answer.isdigit() and len(answer) == digits, answer
        out.append(answer)
    return out
a = answers("a.jsonl", [300] * 6 + [600] * 6, 5)
c = answers("c.jsonl", [300] * 6 + [600] * 6, 5)
n = answers("n.jsonl", [400] * 2, 7)
assert a != c, "another seed gave the same keys"
# RULER's documents: the prompt is the length less the task's tokens to generate, the loss on
# the answers, each line marked with its generator.
ruler = [json.loads(line) for line in open(f"{work}/r.jsonl")]
assert [d["generator"] for d in ruler] == ["ruler/niah_single_1"] * 2 + ["ruler/vt"] * 2, ruler
for d, budget in zip(ruler, [128, 128, 30, 30]):
    labeled = [i for i, l in enumerate(d["labels"]) if l != -100]
    assert labeled[0] == 2048 - budget and labeled == list(range(labeled[0], len(d["input_ids"])))
    answer = tok.decode([d["input_ids"][i] for i in labeled])
    assert (answer.strip().isdigit() and len(answer.strip()) == 7) if budget == 128 else len(answer.split()) == 5, answer
    print("ruler", d["generator"], answer)
assert all("generator" in json.loads(line) for line in open(f"{work}/a.jsonl"))
print("passkey", a, "\nneedle", n)
PY
echo PASS
