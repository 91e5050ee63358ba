#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; tests/fuzz/CMakeLists.txt) and runs the
# six at once, each for a bounded time. Exit status non-zero on any crash, leak, UB report or timeout.
# Usage: tests/fuzz/run.sh [SECONDS_PER_TARGET (default 60)] [BUILD_DIR (default build-fuzz)]
# (FUZZ_JOBS: parallel compile jobs, default nproc)
# Findings (crash-*, leak-*, timeout-*) are left in BUILD_DIR/findings/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
build="${2:-build-fuzz}"
CXX="${CXX:-clang++}"
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
CC="${CC:-clang}" CXX="$CXX" cmake -S tests/fuzz -B "$build" -G Ninja >/dev/null
targets=(fuzz_jsonl_dataset fuzz_safetensors fuzz_job_spec fuzz_mlflow_answer fuzz_webhook_answer fuzz_http_rules)
ninja -C "$build" -j"${FUZZ_JOBS:-$(nproc)}" "${targets[@]}" >"$build/ninja.log" 2>&1 ||
  { tail -40 "$build/ninja.log" >&2; echo "fuzz: building the targets failed; see $build/ninja.log" >&2; exit 1; }

# Seed corpora: the checked-in JSONL seeds, and a small valid safetensors file made here (two
# tensors, metadata) so the fuzzer starts from the accepted format.
work="$build/corpus"
mkdir -p "$work/jsonl" "$work/safetensors" "$work/job_spec" "$work/mlflow_answer" "$work/webhook_answer" \
  "$work/http_rules"
cp tests/fuzz/corpus/jsonl/* "$work/jsonl/"
cp tests/fuzz/corpus/job_spec/* "$work/job_spec/"
cp tests/fuzz/corpus/mlflow_answer/* "$work/mlflow_answer/"
cp tests/fuzz/corpus/webhook_answer/* "$work/webhook_answer/"
cp tests/fuzz/corpus/http_rules/* "$work/http_rules/"
python3 - "$work/safetensors/seed.safetensors" <<'PY'
import json, struct, sys
header = {"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
h = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + bytes(range(22)))
PY

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# The targets fuzz at once (each for SECONDS), then each one's result is reported.
pids=()
for target in "${targets[@]}"; do
  [ "$target" = fuzz_jsonl_dataset ] && corpus="$work/jsonl" dict=tests/fuzz/jsonl.dict
  [ "$target" = fuzz_safetensors ] && corpus="$work/safetensors" dict=tests/fuzz/safetensors.dict
  [ "$target" = fuzz_job_spec ] && corpus="$work/job_spec" dict=tests/fuzz/job_spec.dict
  [ "$target" = fuzz_mlflow_answer ] && corpus="$work/mlflow_answer" dict=tests/fuzz/mlflow_answer.dict
  [ "$target" = fuzz_webhook_answer ] && corpus="$work/webhook_answer" dict=tests/fuzz/mlflow_answer.dict
  [ "$target" = fuzz_http_rules ] && corpus="$work/http_rules" dict=tests/fuzz/http_rules.dict
  findings="$build/findings/$target"
  mkdir -p "$findings"
  echo "fuzz: $target for ${seconds}s" >&2
  "$build/$target" "$corpus" -dict="$dict" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=4096 -artifact_prefix="$findings/" -print_final_stats=1 >"$findings/log.txt" 2>&1 &
  pids+=("$!")
done
status=0
i=0
for target in "${targets[@]}"; do
  findings="$build/findings/$target"
  if ! wait "${pids[$i]}"; then
    echo "fuzz: $target FAILED; see $findings/log.txt" >&2
    tail -40 "$findings/log.txt" >&2
    status=1
  else
    echo "fuzz: $target: $(grep -E '^(stat::number_of_executed_units|Done)' "$findings/log.txt" | tail -1)" >&2
  fi
  i=$((i + 1))
done
exit $status
