#!/usr/bin/env bash
# The GPU half of issue 9, on the GPU machine (through scripts/gpu_run.sh): `oombd serve` with
# /metrics, a long-context LoRA job on a Qwen2.5-0.5B-shaped model with random weights (written
# there with transformers) on 65,536-token samples, and /metrics scraped every second while it
# trains. Output under $OUT/metrics/: scrape-NNN.prom (the exposition text), events.json (the
# job's own events), job.json (the final job), and memory.csv (time, allocated, reserved, peak,
# NVML used, KV bytes by kind) for the memory-curve plot.
set -euo pipefail
OUT="${OUT:-/tmp/oomb-out}"
out="$OUT/metrics"
mkdir -p "$out"
work=/tmp/oomb-gpu-metrics
rm -rf "$work" && mkdir -p "$work"
python3 "$(dirname "$0")/make_random_qwen.py" "$work" 65536
cat >"$work/job.yaml" <<YAML
display_name: gpu-metrics
model: {path: $work/model, dtype: bfloat16}
data: {train: $work/train.jsonl, max_seq_len: 65536}
training: {max_steps: 4, warmup_steps: 0, learning_rate: 1.0e-4}
memory: {chunk_tokens: 4096, page_tokens: 128}
checkpoint: {every_steps: 2}
resources: {device: cuda}
YAML
oombd serve --data-dir "$work/daemon" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
  --set paths.allowed_roots=/tmp >"$work/daemon.log" 2>&1 &
daemon=$!
. "$(dirname "$0")/../scripts/wait_for_daemon.sh"
wait_for_daemon "$work/daemon" "$daemon" "$work/daemon.log" "" oombd.metrics.port oombd.port || exit 1
export OOMB_ENDPOINT="127.0.0.1:$(cat "$work/daemon/oombd.port")"
metrics="http://127.0.0.1:$(cat "$work/daemon/oombd.metrics.port")/metrics"
oomb estimate "$work/job.yaml" | tee "$out/estimate.txt"
job=$(oomb submit "$work/job.yaml" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
i=0
while :; do
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
    "$metrics" >"$out/scrape-$(printf %03d $i).prom" || true
  echo "$(date +%s.%N) $out/scrape-$(printf %03d $i).prom" >>"$out/scrapes.txt"
  state=$(oomb get "$job" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  case "$state" in SUCCEEDED|FAILED|CANCELLED) break ;; esac
  i=$((i + 1)); sleep 1
done
python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "$metrics" >"$out/scrape-final.prom"
oomb get "$job" -o json >"$out/job.json"
oomb events "$job" -o json >"$out/events.json"
kill -TERM "$daemon"; wait "$daemon" || true
cp "$work/daemon.log" "$out/daemon.log"
python3 - "$out" <<'PY'
import os, re, sys
out = sys.argv[1]
def value(text, name, **labels):
    total = None
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total
rows = []
for line in open(os.path.join(out, "scrapes.txt")):
    t, path = line.split()
    text = open(path).read()
    rows.append([float(t), value(text, "oomb_gpu_memory_allocated_bytes"), value(text, "oomb_gpu_memory_reserved_bytes"),
                 value(text, "oomb_gpu_memory_peak_bytes"), value(text, "oomb_gpu_memory_used_bytes"),
                 value(text, "oomb_kv_bytes", kind="kv"), value(text, "oomb_kv_bytes", kind="kv_grad"),
                 value(text, "oomb_job_step")])
with open(os.path.join(out, "memory.csv"), "w") as f:
    f.write("seconds,allocated_bytes,reserved_bytes,peak_bytes,nvml_used_bytes,kv_bytes,kv_grad_bytes,step\n")
    t0 = rows[0][0] if rows else 0
    for r in rows:
        f.write(",".join([f"{r[0] - t0:.2f}"] + ["" if v is None else f"{v:.0f}" for v in r[1:]]) + "\n")
print(f"gpu_metrics: {len(rows)} scrapes")
PY
# One archive: the device tool brings back a limited number of files.
tar czf "$OUT/metrics.tgz" -C "$OUT" metrics && rm -rf "$out"
