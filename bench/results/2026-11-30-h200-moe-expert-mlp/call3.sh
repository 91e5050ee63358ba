#!/usr/bin/env bash
# call 3: the planner's chunks with the gate_up products recomputed where a larger chunk needs it;
# the GPU's expert gradients; the 32K and 16K steps; transformers + PEFT at 32K; 32K again.
cd "$(dirname "$0")/.."
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call3_env.txt
timeout 60 .carry/bin/chunk_trainer_test --gtest_filter='ExpertsGpuTest.*:FusedAdamW*' > $OUT/call3_gpu_tests.log 2>&1
grep -E '^\[ +(OK|FAILED|PASSED) |against' $OUT/call3_gpu_tests.log
timeout 120 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 16384 > $OUT/call3_bench.log 2>&1
timeout 200 python3 bench/peers/peers.py --stack hf-offload --model qwen3-30b-a3b --lengths 32768 > $OUT/call3_peers.jsonl 2> $OUT/call3_peers.err
timeout 90 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 > $OUT/call3_bench_again.log 2>&1
for f in $OUT/call3_bench.log $OUT/call3_bench_again.log; do grep -o '"S":[0-9]*\|"chunk":[0-9]*\|"s_per_step":[0-9.]*\|"mfu":[0-9.]*\|"peak_bytes":[0-9]*\|"planned_peak_bytes":[0-9]*\|"planned_expert_recompute_layers":[0-9]*\|"error[^}]*' $f | tr '\n' ' '; echo; done
cat $OUT/call3_peers.jsonl | cut -c1-400
echo done
