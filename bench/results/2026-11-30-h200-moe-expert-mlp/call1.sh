#!/usr/bin/env bash
# call 1: the 32K MoE step's kernel profile at HEAD (bd7a1e4).
cd "$(dirname "$0")/.."
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call1_env.txt
timeout 150 .carry/bin/bench_train --model qwen3-30b-a3b $A --kernel-profile 80 --sections --lengths 32768 > $OUT/call1_moe_profile.log 2>&1
echo done
