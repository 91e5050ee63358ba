#!/usr/bin/env bash
# call 6: the 32K step and transformers + PEFT again, on another machine (a replication of call 3).
cd "$(dirname "$0")/.."
A="--chunk 0 --kv-offload auto --kv-grad-dtype auto"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call6_env.txt
timeout 90 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 > $OUT/call6_bench.log 2>&1
timeout 200 python3 bench/peers/peers.py --stack hf-offload --model qwen3-30b-a3b --lengths 32768 > $OUT/call6_peers.jsonl 2> $OUT/call6_peers.err
timeout 90 .carry/bin/bench_train --model qwen3-30b-a3b $A --sections --lengths 32768 > $OUT/call6_bench_again.log 2>&1
for f in $OUT/call6_bench.log $OUT/call6_bench_again.log; do grep -o '"S":[0-9]*\|"chunk":[0-9]*\|"s_per_step":[0-9.]*\|"mfu":[0-9.]*\|"peak_bytes":[0-9]*\|"planned_peak_bytes":[0-9]*\|"planned_expert_recompute_layers":[0-9]*\|"error[^}]*' $f | tr '\n' ' '; echo; done
cut -c1-300 $OUT/call6_peers.jsonl
echo done
