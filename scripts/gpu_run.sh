#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, after scripts/gpu_pack.sh carried .carry/:
# checks the device, runs every test binary (the gpu-labelled tests run there instead of
# skipping), then the optional benchmark command. Everything goes under $OUT:
#   env.txt (nvidia-smi, versions), tests.log + <test>.xml, bench.log.
# Usage: bash scripts/gpu_run.sh [BENCH_COMMAND...]
#        OOMB_GPU_SKIP_TESTS=1 skips the test binaries (a benchmark-only call).
#        OOMB_GPU_TEST_FILTER='*Gpu*' runs only those tests of each binary (GoogleTest's filter;
#        '*Gpu*' is every gpu-labelled test: the whole GPU suite); default: every test.
# Ends with one line per binary and a total: passed, failed, skipped (from the XML files).
set -uo pipefail
OUT="${OUT:-/tmp/oomb-out}"
mkdir -p "$OUT"
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
# The wheel's CUDA libraries (torch finds them through its RUNPATH; bench_train's CUPTI here).
cuda_lib=$(dirname "$torch_lib")/../nvidia/cu13/lib
export LD_LIBRARY_PATH="$PWD/.carry/lib:$torch_lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/.carry/bin:$PATH"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nproc; free -g | head -2
  oombd version
} 2>&1 | tee "$OUT/env.txt"
status=0
for t in .carry/bin/*_test; do
  [ "${OOMB_GPU_SKIP_TESTS:-0}" = 1 ] && break
  name=$(basename "$t")
  echo "=== $name" | tee -a "$OUT/tests.log"
  "$t" --gtest_output="xml:$OUT/$name.xml" --gtest_filter="${OOMB_GPU_TEST_FILTER:-*}" >>"$OUT/tests.log" 2>&1 ||
    { status=1; echo "FAILED: $name" | tee -a "$OUT/tests.log"; }
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tail -n 3 || true
done
if [ "${OOMB_GPU_SKIP_TESTS:-0}" != 1 ]; then
  python3 - "$OUT" <<'PY' | tee -a "$OUT/tests.log"
import glob, os, sys, xml.etree.ElementTree as ET
total = [0, 0, 0]
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_test.xml"))):
    n = [0, 0, 0]
    for c in ET.parse(f).getroot().iter("testcase"):
        i = 1 if c.find("failure") is not None else 2 if c.find("skipped") is not None or c.get("result") == "skipped" else 0
        n[i] += 1
    total = [a + b for a, b in zip(total, n)]
    print(f"{os.path.basename(f)[:-4]}: {n[0]} passed, {n[1]} failed, {n[2]} skipped")
print(f"gpu tests: {total[0]} passed, {total[1]} failed, {total[2]} skipped")
PY
fi
if (($#)); then
  echo "=== bench: $*" | tee "$OUT/bench.log"
  "$@" 2>&1 | tee -a "$OUT/bench.log" || status=1
fi
echo "gpu_run: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
