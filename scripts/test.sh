#!/usr/bin/env bash
# The test command (README.md): on a fresh Debian 12 machine, installs what is missing, fetches
# the test model and texts, builds everything from scratch and runs every test.
#
#   scripts/test.sh                 all of it; ends with ctest's summary, then the tests skipped
#                                   (any outside the gpu label fails the run: scripts/ctest_report.py)
#   OOMB_BUILD_DIR=build scripts/test.sh   reuse a build directory (default: a fresh build-test/)
#   CTEST_ARGS="-L unit" scripts/test.sh   pass arguments to ctest
#   OOMB_FUZZ_SECONDS=60 scripts/test.sh   fuzz each parser this long before ctest (default 30; 0: skip)
#   OOMB_CHECK_NEWEST=1 scripts/test.sh    also the newest-release check (label newest:
#                                   scripts/check_newest_releases.sh; needs PyPI)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
bash scripts/setup.sh
if [ -x scripts/fetch_test_data.sh ]; then bash scripts/fetch_test_data.sh; fi

build="${OOMB_BUILD_DIR:-$root/build-test}"
# Paths relative to the checkout in ccache's hashes: a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR="$root"
jobs="${OOMB_JOBS:-$(nproc)}"
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/cmake.log" 2>&1 ||
  { cat "$build/cmake.log"; exit 1; }
echo "[test] building in $build with $jobs jobs" >&2
cmake --build "$build" -j "$jobs"
echo "[test] built in $(( $(date +%s) - start )) s since start" >&2
# Fuzz the JSONL and safetensors readers (clang, ASan + UBSan) for a bounded time first, so
# that ctest's summary stays the last line. OOMB_FUZZ_SECONDS=0 skips it.
if [ "${OOMB_FUZZ_SECONDS:-30}" -gt 0 ]; then
  bash "$root/tests/fuzz/run.sh" "${OOMB_FUZZ_SECONDS:-30}" "$build/fuzz"
fi
cd "$build"
# shellcheck disable=SC2086
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # tests run in parallel: one intra-op thread each
# The newest-release check (label newest: transformers and PEFT as PyPI has them today, not as
# the lock pins them) runs only when asked: OOMB_CHECK_NEWEST=1.
labels=(-LE newest)
[ "${OOMB_CHECK_NEWEST:-0}" = 1 ] && labels=()
ctest_rc=0
ctest --output-on-failure -j "$jobs" --output-junit "$build/ctest-junit.xml" "${labels[@]}" ${CTEST_ARGS:-} ||
  ctest_rc=$?
# After ctest's summary: the tests skipped and why, the slowest, and a failure for any skip
# outside the gpu label (scripts/ctest_report.py); its last line counts passed, failed, skipped.
ctest --show-only=json-v1 "${labels[@]}" ${CTEST_ARGS:-} >"$build/ctest-tests.json"
echo "[test] ctest finished $(( $(date +%s) - start )) s after the start" >&2
report_rc=0
python3 "$root/scripts/ctest_report.py" "$build/ctest-junit.xml" "$build/ctest-tests.json" || report_rc=$?
if ((ctest_rc != 0)); then exit "$ctest_rc"; fi
exit "$report_rc"

