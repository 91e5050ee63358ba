#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, after scripts/gpu_pack.sh carried .carry/:
# checks the device, runs every test binary (the gpu-labelled tests run there instead of
# skipping), then the optional benchmark command. Everything goes under $OUT:
#   env.txt (nvidia-smi, versions), tests.log + <test>.xml, bench.log.
# Usage: bash scripts/gpu_run.sh [BENCH_COMMAND...]
#        OOMB_GPU_SKIP_TESTS=1 skips the test binaries (a benchmark-only call).
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
  "$t" --gtest_output="xml:$OUT/$name.xml" >>"$OUT/tests.log" 2>&1 || { status=1; echo "FAILED: $name" | tee -a "$OUT/tests.log"; }
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tail -n 3 || true
done
if (($#)); then
  echo "=== bench: $*" | tee "$OUT/bench.log"
  "$@" 2>&1 | tee -a "$OUT/bench.log" || status=1
fi
echo "gpu_run: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
