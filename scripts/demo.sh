#!/usr/bin/env bash
# The main job (README.md): on a fresh Debian 12 machine, sets everything up, starts oombd on
# its embedded defaults, fine-tunes SmolLM2-135M-Instruct with LoRA on long Jane Austen samples
# through the CLI with live progress, and prints the checkpoint and how to load it with
# transformers + PEFT.
#
#   bash scripts/demo.sh
#
# Steps: scripts/setup.sh and scripts/fetch_test_data.sh (idempotent); a build into build/
# unless oombd and oomb are there already; `oombd serve` in the background (127.0.0.1:7070,
# data in ~/.local/share/oomb, log in <data dir>/demo-oombd.log), stopped on exit; a JSONL of
# long Austen samples (`oombd data build`) and the job spec in the demo's work directory, which
# lies outside the daemon's data directory (jobs may not read the daemon's own files);
# `oomb submit job.yaml --watch`. The job uses the GPU when there is one (resources.device: auto)
# and is sized to take a few minutes on a 2-core CPU.
#
# Environment:
#   OOMB_BUILD_DIR      the build directory (default: build/)
#   OOMB_DATA_HOME      oombd's data directory (default: ~/.local/share/oomb)
#   OOMB_DATA_DIR       the test data cache of fetch_test_data.sh (default: ~/.cache/oomb/data)
#   DEMO_WORK_DIR       the samples, the job spec and the submit log (default: ~/.cache/oomb/demo)
#   DEMO_STEPS          optimizer steps (default 4; the test command runs the demo with 2)
#   DEMO_MAX_SEQ_LEN    tokens per training sequence (default 2048 on a CPU, 16384 on a GPU)
#   DEMO_SKIP_SETUP=1   skip setup.sh and fetch_test_data.sh (when they already ran)
#   OOMB_SERVER__LISTEN, OOMB_METRICS__LISTEN, OOMB_HTTP__LISTEN   oombd's addresses (config keys
#                       server.listen, metrics.listen, http.listen); with port 0 the daemon picks
#                       free ports and the demo reads the one it chose from <data dir>/oombd.port
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"
BUILD="${OOMB_BUILD_DIR:-$REPO/build}"
DATA="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
SERVER_DATA="${OOMB_DATA_HOME:-$HOME/.local/share/oomb}"
WORK="${DEMO_WORK_DIR:-$HOME/.cache/oomb/demo}"
MODEL="$DATA/models/SmolLM2-135M-Instruct"
STEPS="${DEMO_STEPS:-4}"

log() { printf '[demo] %s\n' "$*" >&2; }
die() { printf '[demo] ERROR: %s\n' "$*" >&2; exit 1; }

# 1. Set up, fetch the model and the texts, build.
if [ "${DEMO_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh
  bash scripts/fetch_test_data.sh
fi
if [ -x "$BUILD/server/oombd" ] && [ -x "$BUILD/client/oomb" ]; then
  log "using the binaries in $BUILD"
else
  log "building oombd and oomb in $BUILD (takes a while the first time)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C "$BUILD" oombd oomb
fi
OOMBD="$BUILD/server/oombd"
OOMB="$BUILD/client/oomb"

# The GPU when there is one: bfloat16 and a longer context there; float32 on a CPU.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  DTYPE=bfloat16; MAX_SEQ_LEN="${DEMO_MAX_SEQ_LEN:-16384}"; CHUNK=4096
  log "GPU found: $(nvidia-smi -L | head -1)"
else
  DTYPE=float32; MAX_SEQ_LEN="${DEMO_MAX_SEQ_LEN:-2048}"; CHUNK=512
  log "no GPU: training on the CPU"
fi

# 2. The daemon, on its embedded defaults, stopped (SIGTERM: it checkpoints running jobs) on exit.
mkdir -p "$SERVER_DATA"
export OOMB_DATA_HOME="$SERVER_DATA"
if [ -z "${OOMB_SERVER__LISTEN:-}" ] && "$OOMB" health >/dev/null 2>&1; then
  die "something already serves on 127.0.0.1:7070 (another oombd?); stop it first"
fi
rm -f "$SERVER_DATA/oombd.port"  # written by the daemon once it listens
"$OOMBD" serve >>"$SERVER_DATA/demo-oombd.log" 2>&1 &
OOMBD_PID=$!
stop_daemon() {
  if kill -0 "$OOMBD_PID" 2>/dev/null; then
    log "stopping oombd (pid $OOMBD_PID)"
    kill -TERM "$OOMBD_PID" 2>/dev/null || true
    wait "$OOMBD_PID" 2>/dev/null || true
  fi
}
trap stop_daemon EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 300); do
  [ -s "$SERVER_DATA/oombd.port" ] && break
  kill -0 "$OOMBD_PID" 2>/dev/null || die "oombd exited; see $SERVER_DATA/demo-oombd.log"
  sleep 0.2
done
[ -s "$SERVER_DATA/oombd.port" ] || die "oombd does not listen; see $SERVER_DATA/demo-oombd.log"
export OOMB_ENDPOINT="127.0.0.1:$(cat "$SERVER_DATA/oombd.port")"
"$OOMB" health >/dev/null || die "oombd does not answer on $OOMB_ENDPOINT; see $SERVER_DATA/demo-oombd.log"
log "oombd is serving on $OOMB_ENDPOINT (pid $OOMBD_PID, data in $SERVER_DATA)"

# 3. Long samples of Austen's novels, one {"text"} line each: `oombd data build` cuts them at
#    paragraph boundaries to at most max_seq_len tokens.
case "$(realpath -m "$WORK")/" in
  "$(realpath -m "$SERVER_DATA")"/*) die "DEMO_WORK_DIR ($WORK) is inside oombd's data directory ($SERVER_DATA), which jobs may not read" ;;
esac
mkdir -p "$WORK"
TRAIN="$WORK/austen.jsonl"
"$OOMBD" data build --model "$MODEL" --tokens "$MAX_SEQ_LEN" --max-samples 32 -o "$TRAIN" "$DATA/texts/austen" >&2

cat >"$WORK/job.yaml" <<EOF
display_name: austen-lora-demo
labels: {demo: austen}
model: {path: $MODEL, dtype: $DTYPE}
method:
  type: lora
  lora: {rank: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
data: {train: $TRAIN, max_seq_len: $MAX_SEQ_LEN, packing: true, too_long: truncate}
training: {max_steps: $STEPS, learning_rate: 2.0e-4, warmup_steps: 0, lr_schedule: cosine}
memory: {chunk_tokens: $CHUNK, page_tokens: 128}
checkpoint: {every_steps: 2, keep_last: 2}
resources: {device: auto}
EOF

# 4. Submit and follow it live (progress bar on a terminal, plain lines otherwise).
log "submitting $WORK/job.yaml: $STEPS steps of $MAX_SEQ_LEN tokens ($DTYPE)"
SUBMIT_OUT="$WORK/submit.out"
set +e
"$OOMB" submit "$WORK/job.yaml" --watch | tee "$SUBMIT_OUT"
rc=${PIPESTATUS[0]}
set -e
JOB="$(head -1 "$SUBMIT_OUT" | cut -d' ' -f1)"
[ "$rc" -eq 0 ] || die "the job did not succeed (oomb exit $rc); see: $OOMB get $JOB; $OOMB events $JOB"

# 5. Where the adapter is and how to load it.
CHECKPOINTS_JSON="$("$OOMB" checkpoints "$JOB" -o json)"
final() { python3 -c 'import json,sys; print([c for c in json.load(sys.stdin)["checkpoints"] if c.get("final")][-1][sys.argv[1]])' "$1" <<<"$CHECKPOINTS_JSON"; }
CHECKPOINT="$(final path)"
cat <<EOF

$JOB SUCCEEDED. The LoRA adapter (PEFT layout):
  $CHECKPOINT

Load it with transformers + PEFT (e.g. $HOME/.cache/oomb/venv/bin/python):
$(final load_code | sed 's/^/  /')
EOF
