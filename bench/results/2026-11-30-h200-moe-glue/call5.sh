#!/usr/bin/env bash
# call 5: gpt-oss-20b at 16K; Qwen3-30B-A3B at 128K.
cd "$(dirname "$0")/.."  # run as .carry/callN.sh from the repository root
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
timeout 100 .carry/bin/bench_train --model gpt-oss-20b $A --sections --lengths 16384 > $OUT/call5_gpt_oss.log 2>&1
timeout 330 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 131072 > $OUT/call5_moe_128k.log 2>&1
echo done
