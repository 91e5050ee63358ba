#!/usr/bin/env bash
# GPU end-to-end run of the daemon and `oombd run` on the GPU machine (through
# scripts/gpu_run.sh): a Qwen2.5-0.5B-shaped model with random weights is written there with
# transformers (no weights can be carried or downloaded), with pre-tokenized 16K-token samples;
# then `oombd run` trains 3 LoRA steps in bf16 on cuda, and `oombd serve` + `oomb submit --watch`
# runs the same job through the service. Output: $OUT/e2e.log, $OUT/metrics.jsonl.
set -euo pipefail
OUT="${OUT:-/tmp/oomb-out}"
work=/tmp/oomb-e2e
rm -rf "$work" && mkdir -p "$work"
python3 "$(dirname "$0")/make_random_qwen.py" "$work" 16384
cat >"$work/job.yaml" <<YAML
display_name: gpu-e2e
model: {path: $work/model, dtype: bfloat16}
data: {train: $work/train.jsonl, max_seq_len: 16384}
training: {max_steps: 3, warmup_steps: 0, learning_rate: 1.0e-4}
memory: {chunk_tokens: 4096, page_tokens: 128}
checkpoint: {every_steps: 2}
resources: {device: cuda}
YAML
echo "== oombd run" | tee "$OUT/e2e.log"
oombd run "$work/job.yaml" --checkpoint-dir "$work/run" 2>&1 | tee -a "$OUT/e2e.log"
cp "$work/run/metrics.jsonl" "$OUT/metrics.jsonl"
echo "== oombd serve + oomb submit --watch" | tee -a "$OUT/e2e.log"
oombd serve --data-dir "$work/daemon" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 >"$work/daemon.log" 2>&1 &
daemon=$!
. "$(dirname "$0")/../scripts/wait_for_daemon.sh"
wait_for_daemon "$work/daemon" "$daemon" "$work/daemon.log" || exit 1
export OOMB_ENDPOINT="127.0.0.1:$(cat "$work/daemon/oombd.port")"
oomb server-info | tee -a "$OUT/e2e.log"
oomb submit "$work/job.yaml" --watch 2>&1 | tee -a "$OUT/e2e.log"
job=$(oomb list -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["name"])')
oomb get "$job" | tee -a "$OUT/e2e.log"
oomb checkpoints "$job" | tee -a "$OUT/e2e.log"
kill -TERM "$daemon"; wait "$daemon" || true
tail -5 "$work/daemon.log" | tee -a "$OUT/e2e.log"
