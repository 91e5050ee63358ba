#!/usr/bin/env bash
# call 3: GPU tests of the new kernels and FusedAdamW, the MoE step at 32K and 16K, the peer at
# 32K, the dense family at 16K and 128K.
cd "$(dirname "$0")/.."  # run as .carry/callN.sh from the repository root
timeout 100 .carry/bin/kernels_gpu_test --gtest_filter='*Merge*:*Scaled*:*PairSum*:*Rope*:*Sinks*:*Glu*' > $OUT/call3_gpu_tests.log 2>&1
timeout 60 .carry/bin/chunk_trainer_test --gtest_filter='ExpertsGpuTest.*:SwapGpuTest.*:FusedAdamW*' >> $OUT/call3_gpu_tests.log 2>&1
grep -E '^\[ +(OK|FAILED|PASSED) ' $OUT/call3_gpu_tests.log
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 16384 > $OUT/call3_bench.log 2>&1
timeout 200 python3 bench/peers/peers.py --stack hf-offload --model qwen3-30b-a3b --lengths 32768 > $OUT/call3_peers.jsonl 2> $OUT/call3_peers.err
timeout 110 .carry/bin/bench_train --model qwen2.5-7b $A --sections --lengths 16384 131072 > $OUT/call3_dense.log 2>&1
echo done
