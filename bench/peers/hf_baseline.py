#!/usr/bin/env python3
"""The HF baseline: what a user would run instead of oomb, timed the way oomb's step is.

What it measures. Hugging Face transformers + PEFT LoRA (r=16, alpha=32, on q, k, v, o, gate,
up and down) + non-reentrant gradient checkpointing + SDPA attention, batch 1, bf16, on a
Qwen2.5-7B-shaped model (or Qwen2.5-0.5B's, --model) with random weights: memory and speed do not
depend on the weight values. For each sequence length given, one training step (forward +
backward + zero_grad; no optimizer step, which oomb's bench_train step includes) is timed after
a warm-up step of min(S, 2048) tokens; the peak is torch's peak allocated bytes of that step.
Prints a first line describing the run ({"baseline", "model", "method", "transformers",
"peft", "torch", "device"}), then one JSON line per length: {"S", "s_per_step", "tok_s",
"peak_bytes"} or {"S", "oom": true}.

Where it comes from. The "HF baseline" rows of docs/PERFORMANCE.md before the peers of
bench/peers/peers.py (whose `hf` stack is the same setup) were measured with this script, run
from the session's shared folder outside the repository (shared/bench/hf_baseline.py) and
carried to the GPU machine by bench/run_train_bench.sh. This is a copy of that file, unchanged
below this docstring; that the shared copy is byte for byte the one those runs used cannot be
checked from the results, whose JSON lines it prints in the same form.

Run it on a GPU machine in the same call as oomb's own benchmark, so the two are compared on the
same device in one run:  python3 bench/peers/hf_baseline.py --lengths 4096 16384 32768
"""
import argparse, json, time
import torch, transformers, peft

PRESETS = {
    # Qwen2.5-7B architecture.
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # Qwen2.5-0.5B architecture, for quick checks.
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-7b", choices=sorted(PRESETS))
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cfg = transformers.Qwen2Config(max_position_embeddings=1 << 23, attn_implementation="sdpa",
                                   **PRESETS[args.model])
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not args.full:
        model.enable_input_require_grads()
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"]))
    model.train()
    meta = {"baseline": "hf-transformers+peft+gc+sdpa", "model": args.model,
            "method": "full" if args.full else "lora", "transformers": transformers.__version__,
            "peft": peft.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name()}
    print(json.dumps(meta), flush=True)

    def step(S):
        ids = torch.randint(0, cfg.vocab_size - 1, (1, S), device="cuda")
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)

    for S in args.lengths:
        torch.cuda.empty_cache()
        try:
            step(min(S, 2048))  # warm-up: kernels, allocator
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            step(S)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            print(json.dumps({"S": S, "s_per_step": round(dt, 3), "tok_s": round(S / dt, 1),
                              "peak_bytes": torch.cuda.max_memory_allocated()}), flush=True)
        except torch.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            print(json.dumps({"S": S, "oom": True}), flush=True)

if __name__ == "__main__":
    main()
