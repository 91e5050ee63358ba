#!/usr/bin/env bash
# The measurements of swap instead of recompute, the job spec's defaults and the peers
# (the swap-peers run in bench/results), one part per device call on one warm GPU machine,
# so oomb and the peers run on the same card. Run through scripts/gpu_run.sh after
# scripts/gpu_pack.sh (carry .carry; the peers' parts also .whl, bench/peers/fetch_wheels.sh):
#   oomb     Qwen2.5-7B LoRA r=16: the job spec's defaults (chunk_tokens auto, swap on,
#            kv_offload auto, float32 gradient pages) at 16K, 64K, 128K; the best settings
#            (chunks of 8192, bfloat16 gradient pages) with the swap off and on at 128K, on at
#            16K, 64K and 256K; the swap's gradients against recompute's at 64K (--grad-check).
#   peers-a  bench/peers: hf, liger, liger-offload at 16K, 64K, 128K.
#   peers-b  bench/peers: unsloth at 16K, 64K, 128K.
#   fit      --fit-check 2 at LENGTH (default 524288): stage 1 and stage 2's first chunks, the
#            measured peaks against the plan's.
#   defaults the job spec's defaults only, at LENGTHS (default 16384 131072), the first with the
#            step's GPU time by section.
# Output under $OUT: oomb_*.jsonl, peers.jsonl and the logs.
set -uo pipefail
OUT="${OUT:-/tmp/oomb-out}"
mkdir -p "$OUT"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
B="bench_train --model qwen2.5-7b --kv-offload auto"
D="$B --chunk 0 --kv-grad-dtype auto"  # the job spec's defaults
case "${1:-}" in
  oomb)
    $B --chunk 0 --lengths 16384 65536 131072 | tee "$OUT/oomb_defaults.jsonl"
    $B --chunk 8192 --kv-grad-dtype bfloat16 --swap off --lengths 131072 | tee "$OUT/oomb_best_recompute.jsonl"
    $B --chunk 8192 --kv-grad-dtype bfloat16 --lengths 16384 65536 131072 --grad-check 65536 |
      tee "$OUT/oomb_best.jsonl"
    $B --chunk 8192 --kv-grad-dtype bfloat16 --lengths 262144 | tee "$OUT/oomb_256k.jsonl"
    ;;
  peers-a)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
    OUT="$OUT" PEERS_TIMEOUT=${PEERS_TIMEOUT:-190} bash bench/peers/run_peers.sh hf liger liger-offload -- --warmup first
    ;;
  peers-b)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
    OUT="$OUT" PEERS_TIMEOUT=${PEERS_TIMEOUT:-560} bash bench/peers/run_peers.sh unsloth -- --warmup first
    ;;
  fit)
    $B --chunk 8192 --kv-grad-dtype bfloat16 --lengths "${2:-524288}" --fit-check 2 | tee "$OUT/oomb_fit.jsonl"
    ;;
  defaults)
    shift
    [ $# -gt 0 ] || set -- 16384 131072
    $D --lengths "$1" --sections | tee "$OUT/oomb_defaults.jsonl"
    shift
    for length in "$@"; do
      $D --lengths "$length" | tee -a "$OUT/oomb_defaults.jsonl"
    done
    ;;
  *)
    echo "usage: $0 oomb | peers-a | peers-b | fit [LENGTH] | defaults [LENGTHS...]" >&2
    exit 2
    ;;
esac
