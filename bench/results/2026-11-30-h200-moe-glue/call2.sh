#!/usr/bin/env bash
# call 2: GPU tests of the new kernels, the MoE step at 32K and 16K, the peer at 32K.
cd "$(dirname "$0")/.."  # run as .carry/callN.sh from the repository root
timeout 150 .carry/bin/kernels_gpu_test --gtest_filter='*Merge*:*Scaled*:*PagedAttention*:*Sparse*:*Sinks*:*Rope*:*PairSum*' > $OUT/call2_gpu_tests.log 2>&1
timeout 120 .carry/bin/chunk_trainer_test --gtest_filter='ExpertsGpuTest.*:SwapGpuTest.*' >> $OUT/call2_gpu_tests.log 2>&1
grep -E '^\[  (PASSED|FAILED)|FAILED ' $OUT/call2_gpu_tests.log
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 16384 > $OUT/call2_bench.log 2>&1
timeout 200 python3 bench/peers/peers.py --stack hf-offload --model qwen3-30b-a3b --lengths 32768 > $OUT/call2_peers.jsonl 2> $OUT/call2_peers.err
echo done
