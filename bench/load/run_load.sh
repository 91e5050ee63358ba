#!/usr/bin/env bash
# The load benchmark of issue 11 on this machine: oombd on its defaults (CPU) in a temporary
# data dir, one LoRA job on the tiny test model training throughout, and bench/load/load_test.py
# with CLIENTS clients and WATCHERS watch streams for DURATION seconds.
# Usage: bench/load/run_load.sh OUT_DIR [CLIENTS] [WATCHERS] [DURATION]
# Writes OUT_DIR/load.json, OUT_DIR/load.md (the table) and OUT_DIR/oombd.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$1"; clients="${2:-32}"; watchers="${3:-8}"; duration="${4:-60}"
build="${OOMB_BUILD_DIR:-build}"
python="${OOMB_PYTHON:-$HOME/.cache/oomb/venv/bin/python}"
tiny="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}/tiny/llama-gqa"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$python" - "$tmp/ids.jsonl" <<'PY'
import json, random, sys
rng = random.Random(1)
with open(sys.argv[1], "w") as f:
    for _ in range(8):
        f.write(json.dumps({"input_ids": [rng.randrange(3, 256) for _ in range(120)]}) + "\n")
PY
cat > "$tmp/spec.json" <<JSON
{"display_name": "load", "model": {"path": "$tiny", "dtype": "float32"},
 "method": {"type": "lora", "lora": {"rank": 4, "alpha": 8}},
 "data": {"train": "$tmp/ids.jsonl", "max_seq_len": 128, "packing": false},
 "training": {"max_steps": 1000000, "learning_rate": 0.001},
 "memory": {"chunk_tokens": 32, "page_tokens": 16},
 "checkpoint": {"every_steps": 0}, "resources": {"device": "cpu"}}
JSON
"$build/server/oombd" serve --listen 127.0.0.1:0 --data-dir "$tmp/data" \
  --set scheduler.max_queued_jobs_per_client=0 2>"$out/oombd.log" &
pid=$!
# shellcheck source=scripts/wait_for_daemon.sh
. scripts/wait_for_daemon.sh
wait_for_daemon "$tmp/data" "$pid" "$out/oombd.log" || exit 1
"$python" bench/load/load_test.py --endpoint "127.0.0.1:$(cat "$tmp/data/oombd.port")" \
  --spec-json "$tmp/spec.json" --clients "$clients" --watchers "$watchers" --duration "$duration" \
  --json "$out/load.json" | tee "$out/load.md"
