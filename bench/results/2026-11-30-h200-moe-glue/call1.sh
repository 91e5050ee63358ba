#!/usr/bin/env bash
# call 1: dense before/after (Qwen2.5-7B 16K, 128K), then the MoE 32K kernel profile.
cd "$(dirname "$0")/.."  # run as .carry/callN.sh from the repository root
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
timeout 170 .carry/bin/bench_train_before --model qwen2.5-7b $A --sections --lengths 16384 131072 > $OUT/call1_dense_before.log 2>&1
timeout 170 .carry/bin/bench_train --model qwen2.5-7b $A --sections --lengths 16384 131072 > $OUT/call1_dense_after.log 2>&1
timeout 150 .carry/bin/bench_train --model qwen3-30b-a3b $A --kernel-profile 60 --lengths 32768 > $OUT/call1_moe_profile.log 2>&1
echo done
