#!/usr/bin/env bash
# The README's main command as a test: `bash scripts/demo.sh` end to end (set-up checks, the real
# oombd on its embedded defaults, the real CLI, SmolLM2-135M-Instruct fine-tuned on Austen on the
# CPU), with the demo's documented knob DEMO_STEPS=2 for CI's time. Beside the demo's defaults it
# sets only where things go: the build to use, a fresh data directory and work directory, and
# port 0 (the daemon picks free ports), so that it runs beside other tests and a user's oombd.
# Then the loading code the demo printed is run with the Python environment's transformers +
# PEFT, and must load the adapter it names.
#
#   tests/smoke/demo_test.sh BUILD_DIR PYTHON
set -euo pipefail
build="$1"
python="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d /tmp/oomb-demo-test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

set +e
OOMB_BUILD_DIR="$build" OOMB_DATA_HOME="$tmp/data" DEMO_WORK_DIR="$tmp/work" DEMO_STEPS=2 \
  OOMB_SERVER__LISTEN=127.0.0.1:0 OOMB_METRICS__LISTEN=127.0.0.1:0 OOMB_HTTP__LISTEN=127.0.0.1:0 \
  bash "$root/scripts/demo.sh" >"$tmp/demo.out"
rc=$?
set -e
cat "$tmp/demo.out"
if [ "$rc" -ne 0 ]; then
  echo "demo_test: scripts/demo.sh exited $rc; the daemon's log:" >&2
  tail -40 "$tmp/data/demo-oombd.log" >&2 || true
  exit 1
fi
grep -q " SUCCEEDED. The LoRA adapter (PEFT layout):" "$tmp/demo.out" || { echo "demo_test: no success line" >&2; exit 1; }
adapter="$(grep -A1 "The LoRA adapter (PEFT layout):" "$tmp/demo.out" | tail -1 | sed 's/^ *//')"
for f in adapter_model.safetensors adapter_config.json; do
  [ -s "$adapter/$f" ] || { echo "demo_test: $adapter/$f is missing" >&2; exit 1; }
done
# The printed loading code, unindented, run as printed.
sed -n '/^Load it with transformers + PEFT/,$p' "$tmp/demo.out" | tail -n +2 | sed 's/^  //' >"$tmp/load.py"
printf '\nprint("loaded", type(model).__name__)\n' >>"$tmp/load.py"
HF_HUB_OFFLINE=1 "$python" "$tmp/load.py" | tee "$tmp/load.out"
grep -q "^loaded " "$tmp/load.out" || { echo "demo_test: the printed loading code did not load the adapter" >&2; exit 1; }
echo "demo_test: ok"
