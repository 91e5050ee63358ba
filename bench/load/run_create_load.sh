#!/usr/bin/env bash
# Issue 36's load benchmark on this machine: `oombd serve` (jobs held, so only CreateJob's checks
# run) with its plaintext health port, and bench/load/create_load.py: CREATES concurrent
# CreateJobs each scanning an MB-megabyte text dataset with the real SmolLM2 tokenizer, while
# health checks (1 s deadline) and GetJob/ListJobs run.
# Usage: bench/load/run_create_load.sh OUT_DIR [CREATES] [MB] [MAX_READ_P99_MS]
# Writes OUT_DIR/create_load.json, OUT_DIR/create_load.md and OUT_DIR/oombd.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$1"; creates="${2:-8}"; mb="${3:-15}"; p99="${4:-0}"
build="${OOMB_BUILD_DIR:-build}"
python="${OOMB_PYTHON:-$HOME/.cache/oomb/venv/bin/python}"
data="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
model="$data/models/SmolLM2-135M-Instruct"
[ -f "$model/tokenizer.json" ] || { echo "create_load: skipped: no $model"; exit 77; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$build/server/oombd" serve --listen 127.0.0.1:0 --data-dir "$tmp/data" --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
  --set scheduler.hold=true --set scheduler.max_queued_jobs_per_client=0 \
  --set server.health_listen=127.0.0.1:0 --set "paths.allowed_roots=$tmp,$data" 2>"$out/oombd.log" &
pid=$!
# shellcheck source=scripts/wait_for_daemon.sh
. scripts/wait_for_daemon.sh
wait_for_daemon "$tmp/data" "$pid" "$out/oombd.log" "" oombd.health.port oombd.port || exit 1
"$python" bench/load/create_load.py --endpoint "127.0.0.1:$(cat "$tmp/data/oombd.port")" \
  --health-endpoint "127.0.0.1:$(cat "$tmp/data/oombd.health.port")" --model "$model" \
  --texts "$data/texts/austen/emma.txt" --work-dir "$tmp/datasets" --creates "$creates" --mb "$mb" \
  --max-read-p99-ms "$p99" --json "$out/create_load.json" | tee "$out/create_load.md"
