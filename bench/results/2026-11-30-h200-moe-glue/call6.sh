#!/usr/bin/env bash
# call 6: Qwen3-30B-A3B at 262,144 tokens (8x the peer's longest, 32,768).
cd "$(dirname "$0")/.."  # run as .carry/callN.sh from the repository root
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
timeout 430 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 262144 > $OUT/call6_moe_256k.log 2>&1
echo "rc=$?"
