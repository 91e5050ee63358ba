#!/usr/bin/env bash
# call 5: Qwen3-30B-A3B at 262,144 tokens (8x the peer's longest), the planner's chunks.
cd "$(dirname "$0")/.."
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call5_env.txt
timeout 520 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 262144 > $OUT/call5_moe_256k.log 2>&1
grep -o '"S":[0-9]*\|"chunk":[0-9]*\|"s_per_step":[0-9.]*\|"mfu":[0-9.]*\|"peak_bytes":[0-9]*\|"planned_peak_bytes":[0-9]*\|"planned_expert_recompute_layers":[0-9]*\|"error[^}]*' $OUT/call5_moe_256k.log | tr '\n' ' '; echo
echo done
