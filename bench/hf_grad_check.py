#!/usr/bin/env python3
"""The HF baseline's own bf16 precision: LoRA gradients of a bf16 training step against a float32
step of the same (bf16-valued) weights, measured like bench_train --grad-check measures oomb's.

Hugging Face transformers + PEFT LoRA (r=16 on all linear layers, lora_B drawn N(0, 0.02) so
that dA is not zero) + gradient checkpointing + SDPA, on the Qwen2.5-7B architecture with random
weights (HF's initializer, std 0.02). One sequence of S random tokens; the loss is the mean
cross-entropy. Prints {"S", "cosine", "relative_error", "parameters"} with
cosine = <g16, g32> / (|g16| |g32|) and relative_error = |g16 - g32| / |g32| over all LoRA
gradients together. TF32 is off, so float32 is float32.

  python3 bench/hf_grad_check.py --length 16384
"""
import argparse
import json

import peft
import torch
import torch.nn.attention
import transformers
from transformers.integrations import sdpa_attention

QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, rms_norm_eps=1e-6,
                 tie_word_embeddings=False)


def lora_grads(model, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    cfg = transformers.Qwen2Config(max_position_embeddings=1 << 20, attn_implementation="sdpa", **QWEN25_7B)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = peft.get_peft_model(model, peft.LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    model.train()
    ids = torch.randint(0, cfg.vocab_size - 1, (1, args.length), device="cuda")
    g16 = lora_grads(model, ids)
    model.float()  # the same bf16 values, computed in float32
    # SDPA's math path would hold the whole score matrix in float32 (28 GiB at 16K); the
    # memory-efficient kernel takes float32 but not GQA, so transformers repeats the KV heads.
    sdpa_attention.use_gqa_in_sdpa = lambda *args, **kwargs: False
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):
        g32 = lora_grads(model, ids)
    dot = n16 = n32 = diff = 0.0
    for name, a in g32.items():
        b = g16[name]
        dot += (a * b).sum().item()
        n16 += (b * b).sum().item()
        n32 += (a * a).sum().item()
        diff += ((a - b) ** 2).sum().item()
    print(json.dumps({"S": args.length, "cosine": dot / (n16 * n32) ** 0.5, "relative_error": (diff / n32) ** 0.5,
                      "parameters": len(g32), "transformers": transformers.__version__, "peft": peft.__version__,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
