# shellcheck shell=bash
: "${work:?set by the sourcing script}" "${log:?set by the sourcing script}"
# Sourced by the SmolLM2 benchmarks on the GPU machine (bench/gpu_sparse_quality.sh,
# bench/gpu_context_extension.sh), with $work (a scratch directory) and $log set. Prepares:
#   $work/model        the real SmolLM2-135M-Instruct, as CI has it;
#   $work/train.jsonl  11 samples of 290,000 characters (at least 64K tokens) of five Austen
#                      novels cut in order (Pride and Prejudice, Emma, Mansfield Park, Sense and
#                      Sensibility, Northanger Abbey);
#   $work/val.jsonl    the first such sample of Persuasion, held out from training;
#   $work/persuasion.txt  Persuasion (held out; the needle suite's haystack).
# The model cannot be downloaded there and is larger than one call may carry: the GGUF of
# scripts/fetch_test_data.sh (SmolLM2-135M-Instruct.Q4_1.gguf) travels in two earlier calls,
# split here with `split -b 49m -d SmolLM2-135M-Instruct.Q4_1.gguf smol.gguf.part-` into
# .stage1/ and .stage2/, each call running `mkdir -p /tmp/stage && cp .stage*/* /tmp/stage/`
# (the machine keeps /tmp while it stays warm). This joins, checks and converts it
# (scripts/gguf_to_hf.py with the gguf wheel carried in .qdata/). Texts: .qdata/*.txt (Debian
# r-cran-janeaustenr, as scripts/fetch_test_data.sh extracts them).
cat /tmp/stage/smol.gguf.part-* >"$work/smol.gguf"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $work/smol.gguf" | sha256sum -c | tee -a "$log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .qdata/gguf-*.whl
PYTHONPATH=/tmp/site python3 scripts/gguf_to_hf.py "$work/smol.gguf" "$work/model" 2>&1 | tail -3 | tee -a "$log"
# The tokenizer CI uses (made by the same script with this machine's older transformers: the
# GPU machine's transformers 5.x writes a byte-fallback BPE that oomb's tokenizer does not read).
cp .qdata/tokenizer.json .qdata/tokenizer_config.json "$work/model/"
cp .qdata/persuasion.txt "$work/persuasion.txt"
python3 - "$work" <<'PY' | tee -a "$log"
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
