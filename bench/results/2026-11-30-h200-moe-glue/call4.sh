#!/usr/bin/env bash
# call 4: the MoE step at 32K and 16K (and 32K again after the peer), the peer at 32K.
cd "$(dirname "$0")/.."  # run as .carry/callN.sh from the repository root
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
timeout 50 .carry/bin/chunk_trainer_test --gtest_filter='ExpertsGpuTest.*:FusedAdamW*' > $OUT/call4_gpu_tests.log 2>&1
grep -E '^\[ +(OK|FAILED|PASSED) ' $OUT/call4_gpu_tests.log
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 16384 > $OUT/call4_bench.log 2>&1
timeout 200 python3 bench/peers/peers.py --stack hf-offload --model qwen3-30b-a3b --lengths 32768 > $OUT/call4_peers.jsonl 2> $OUT/call4_peers.err
timeout 90 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 > $OUT/call4_bench_again.log 2>&1
echo done
