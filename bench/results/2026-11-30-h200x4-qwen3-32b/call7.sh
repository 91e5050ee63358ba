#!/usr/bin/env bash
# call 7 (4xH200): Qwen3-32B's shape, LoRA, tensor parallelism over the 4 GPUs, one step at 262,144 tokens.
cd "$(dirname "$0")/.."
nvidia-smi topo -m > $OUT/call7_topo.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/call7_env.txt
timeout 470 .carry/bin/bench_train --model qwen3-32b --chunk 0 --kv-offload auto --kv-grad-dtype auto --tensor 4 --sections --lengths 262144 > $OUT/call7_qwen3_32b_tp4_256k.log 2>&1
echo "rc=$?"
grep -o '"S":[0-9]*\|"chunk":[0-9]*\|"s_per_step":[0-9.]*\|"mfu":[0-9.]*\|"peak_bytes":[0-9]*\|"planned_peak_bytes":[0-9]*\|"planned_over_measured":[0-9.]*\|"planned_max_seq_len":[0-9]*\|"error[^}]*' $OUT/call7_qwen3_32b_tp4_256k.log | tr '\n' ' '; echo
echo done
