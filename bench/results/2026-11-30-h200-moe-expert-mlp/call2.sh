#!/usr/bin/env bash
# call 2: GroupedExpertMlp — the GPU's expert gradients against the loop, then the 32K step with the
# planner's chunks and with chunks of 16384.
cd "$(dirname "$0")/.."
A="--kv-offload auto --kv-grad-dtype auto"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call2_env.txt
timeout 60 .carry/bin/chunk_trainer_test --gtest_filter='ExpertsGpuTest.*' > $OUT/call2_gpu_tests.log 2>&1
grep -E '^\[ +(OK|FAILED|PASSED) |against' $OUT/call2_gpu_tests.log
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b --chunk 0 $A --sections --lengths 32768 > $OUT/call2_auto.log 2>&1
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b --chunk 16384 $A --sections --lengths 32768 > $OUT/call2_chunk16k.log 2>&1
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b --chunk 16384 $A --kernel-profile 40 --lengths 32768 > $OUT/call2_chunk16k_profile.log 2>&1
for f in $OUT/call2_auto.log $OUT/call2_chunk16k.log; do grep -o '"S":[0-9]*\|"chunk":[0-9]*\|"s_per_step":[0-9.]*\|"mfu":[0-9.]*\|"peak_bytes":[0-9]*\|"planned_peak_bytes":[0-9]*\|"error[^}]*' $f | tr '\n' ' '; echo; done
echo done
