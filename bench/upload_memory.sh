#!/usr/bin/env bash
# Issue 78, item 5: the daemon's peak RSS (VmHWM) while 8 uploads of 250 MB run at once through
# the real CLI (`oomb datasets upload`) against a real `oombd serve` on loopback, for three
# datasets of the same size:
#   single-line  one 250 MB {"text": ...} line (the issue's attack): refused at
#                uploads.max_line_bytes, naming line 1;
#   long-lines   lines just under uploads.max_line_bytes (the most a line's check may hold);
#   short-lines  lines of about 1 KB (an ordinary dataset).
# Each case runs on a fresh daemon and data dir, so each VmHWM is that case's alone.
#
# Usage: bench/upload_memory.sh [BUILD_DIR] [MB]   (defaults: build, 250)
# Output: one line per upload (exit code, seconds, the CLI's last line) and per case
#   case=... uploads=8 accepted=N refused=N start_rss_mb=... peak_rss_mb=... seconds=...
set -euo pipefail
build=${1:-build}
mb=${2:-250}
oombd=$(realpath "$build/server/oombd")
oomb=$(realpath "$build/client/oomb")
work=$(mktemp -d /tmp/oomb-upload-memory.XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
pid=0
max_line=$((16 << 20))

python3 - "$work" "$mb" "$max_line" <<'EOF'
import sys
work, mb, max_line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
size = mb * 1000 * 1000
block = b"x" * (1 << 20)
def write(name, line_bytes):
    with open(f"{work}/{name}.jsonl", "wb") as f:
        done = 0
        while done < size:
            body = min(line_bytes, size - done) - len(b'{"text": ""}\n')
            f.write(b'{"text": "')
            left = body
            while left > 0:
                f.write(block[:min(left, len(block))])
                left -= min(left, len(block))
            f.write(b'"}\n')
            done += body + len(b'{"text": ""}\n')
write("single-line", size)
write("long-lines", max_line - 1024)
write("short-lines", 1000)
EOF

hwm() { awk '/^VmHWM:/ {print int($2 / 1024)}' "/proc/$1/status"; }
rss() { awk '/^VmRSS:/ {print int($2 / 1024)}' "/proc/$1/status"; }

echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {print int($2/1048576)}' /proc/meminfo) GiB;" \
  "oombd $("$oombd" version 2>/dev/null | head -1); $mb MB per upload, 8 at once"
for name in single-line long-lines short-lines; do
  data="$work/data-$name"
  mkdir -p "$data"
  "$oombd" serve --data-dir "$data" --listen 127.0.0.1:0 --metrics-listen "" --http-listen "" \
    --set uploads.max_concurrent_per_project=8 2>"$work/oombd-$name.log" &
  pid=$!
  for _ in $(seq 1200); do [ -s "$data/oombd.port" ] && break; sleep 0.1; done
  [ -s "$data/oombd.port" ] || { echo "case=$name: oombd did not start in 120 s:"; tail -5 "$work/oombd-$name.log"; exit 1; }
  port=$(cat "$data/oombd.port")
  start_rss=$(rss "$pid")
  t0=$(date +%s.%N)
  pids=()
  for i in 1 2 3 4 5 6 7 8; do
    ( s=$(date +%s.%N)
      rc=0
      "$oomb" --endpoint "127.0.0.1:$port" datasets upload "$work/$name.jsonl" --id "$name-$i" \
        >"$work/out-$name-$i" 2>&1 || rc=$?
      printf 'upload case=%s i=%s rc=%s seconds=%.1f: %s\n' "$name" "$i" "$rc" \
        "$(echo "$(date +%s.%N) - $s" | bc)" "$(tail -c 300 "$work/out-$name-$i" | tr '\n' ' ')"
    ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  seconds=$(echo "$(date +%s.%N) - $t0" | bc)
  peak=$(hwm "$pid")
  accepted=$(ls "$data/datasets/default" 2>/dev/null | grep -c '\.jsonl$' || true)
  printf 'case=%s uploads=8 accepted=%s refused=%s start_rss_mb=%s peak_rss_mb=%s seconds=%.1f\n' \
    "$name" "$accepted" "$((8 - accepted))" "$start_rss" "$peak" "$seconds"
  kill "$pid"
  wait "$pid" || true
  pid=0
  rm -rf "$data"
done
