#!/usr/bin/env bash
# call 4: Qwen3-30B-A3B at 131,072 tokens (the planner's chunks are now 16384) and gpt-oss-20b at 16K
# (its experts, with biases, keep the separate functions).
cd "$(dirname "$0")/.."
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call4_env.txt
timeout 60 .carry/bin/bench_train --model gpt-oss-20b $A --sections --lengths 16384 > $OUT/call4_gpt_oss.log 2>&1
timeout 300 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 131072 > $OUT/call4_moe_128k.log 2>&1
for f in $OUT/call4_gpt_oss.log $OUT/call4_moe_128k.log; do grep -o '"S":[0-9]*\|"chunk":[0-9]*\|"s_per_step":[0-9.]*\|"mfu":[0-9.]*\|"peak_bytes":[0-9]*\|"planned_peak_bytes":[0-9]*\|"planned_expert_recompute_layers":[0-9]*\|"error[^}]*' $f | tr '\n' ' '; echo; done
echo done
