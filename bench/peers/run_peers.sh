#!/usr/bin/env bash
# Run peers.py for each stack named, one process per stack, one after the other.
#
#   bash bench/peers/run_peers.sh [STACK...] [-- PEERS_ARGS...]
#
# STACK: hf liger liger-offload unsloth (default: all four, in that order). Arguments after `--`
# go to every peers.py call (e.g. -- --lengths 16384 65536 --longest).
# Environment:
#   OUT            output folder (default /tmp/peers-out): JSON lines of all stacks are appended to
#                  $OUT/peers.jsonl, each stack's full log (stdout + stderr) to $OUT/peers-<stack>.log
#   PEERS_TIMEOUT  seconds per stack (default 300); a stack that runs over is killed (SIGTERM, then
#                  SIGKILL 20 s later) and a {"stack", "error": "timeout ..."} line is recorded
#   PYTHON         interpreter (default python3)
# Exit status: 0 if every stack ran to its end, else 1 (the other stacks still run).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-/tmp/peers-out}"
PEERS_TIMEOUT="${PEERS_TIMEOUT:-300}"
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

stacks=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do stacks+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#stacks[@]} -eq 0 ] && stacks=(hf liger liger-offload unsloth)

mkdir -p "$OUT"
JSONL="$OUT/peers.jsonl"
status=0
for s in "${stacks[@]}"; do
  case "$s" in hf|liger|liger-offload|unsloth) ;; *) echo "unknown stack: $s" >&2; status=1; continue;; esac
  log="$OUT/peers-$s.log"
  echo "== $s (timeout ${PEERS_TIMEOUT}s) $(date -u +%H:%M:%S)" >&2
  t0=$(date +%s)
  # stdout (JSON lines only: peers.py sends everything else to stderr) -> peers.jsonl and the log;
  # stderr -> the log.
  this="$OUT/.peers-$s.this.jsonl"
  timeout -k 20 "$PEERS_TIMEOUT" "$PYTHON" "$HERE/peers.py" --stack "$s" "$@" \
      2>>"$log" | tee -a "$log" | grep --line-buffered '^{' | tee "$this" >>"$JSONL"
  rc=${PIPESTATUS[0]}
  dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "{\"stack\": \"$s\", \"error\": \"timeout after ${PEERS_TIMEOUT} s (PEERS_TIMEOUT)\"}" >>"$JSONL"
  elif [ "$rc" -ne 0 ] && ! grep -q '"error"' "$this"; then
    echo "{\"stack\": \"$s\", \"error\": \"exit status $rc (see peers-$s.log)\"}" >>"$JSONL"
  fi
  rm -f "$this"
  [ "$rc" -ne 0 ] && status=1
  echo "== $s: exit $rc after ${dt}s; last lines:" >&2
  tail -n 3 "$log" >&2
done
echo "== JSON lines in $JSONL" >&2
exit $status
