#!/usr/bin/env bash
# Prepares a run on the GPU machine (the `device` tool; see README.md "GPU machine").
#
# The GPU machine (Ubuntu 24.04, torch 2.11.0+cu130, nvcc 13) has no gRPC, Abseil, yaml-cpp or
# prometheus-cpp and cannot install anything. So everything is built here (CUDA code included,
# for sm_90) and carried: the binaries into .carry/bin and the Debian runtime libraries they
# need into .carry/lib. LibTorch itself is not carried: the GPU machine's torch 2.11.0 is the
# same release as the wheel linked here, and scripts/gpu_run.sh puts its lib/ on the path.
#
# Usage: scripts/gpu_pack.sh [BUILD_DIR]    then call the device tool with carry [".carry"] and
#        command "bash scripts/gpu_run.sh [BENCH_COMMAND...]".
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build"
rm -rf .carry && mkdir -p .carry/bin .carry/lib
# Binaries: daemon, CLI, benchmarks, the gpu-labelled tests and the CPU references they rest on,
# the metrics tests (NVML is only there on the GPU machine) (OOMB_GPU_PACK_TESTS adds more test
# binaries by name).
# Every binary holding a gpu-labelled test (the Gpu-named tests: cmake/OombTargets.cmake) is here.
wanted="oombd oomb bench_train bench_copy_paths link_smoke_gpu_test kernels_gpu_test paged_attention_test chunk_trainer_test
  host_tier_test copy_engine_test kv_store_test data_parallel_test metrics_sources_test metrics_test ${OOMB_GPU_PACK_TESTS:-}"
for name in $wanted; do
  f=$(find "$build" -type f -executable -name "$name" -not -path '*/CMakeFiles/*' | head -n 1)
  [ -n "$f" ] || { echo "gpu_pack: $name not built" >&2; exit 1; }
  cp "$f" .carry/bin/
done
# Runtime libraries from Debian that the binaries link, except the C/C++ runtime (newer on
# Ubuntu 24.04, backward compatible), LibTorch and CUDA (present there).
skip='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libstdc\+\+|libgcc_s|libtorch.*|libc10.*|libcuda.*|libcudart|libcublas.*|libcudnn.*|libnv.*|libnccl|libcusparse.*|libcufft.*|libcurand|libcusolver.*|libcupti|libgomp|libshm)\.so'
for b in .carry/bin/*; do
  ldd "$b" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]] || [[ "$path" == *"/.cache/oomb/"* ]]; then continue; fi
  cp -L "$path" ".carry/lib/$name"
done
strip --strip-debug .carry/bin/* 2>/dev/null || true
echo "carry: $(du -sh .carry | cut -f1) ($(ls .carry/bin | wc -l) binaries, $(ls .carry/lib | wc -l) libraries)" >&2
