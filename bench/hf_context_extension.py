#!/usr/bin/env python3
"""The same context-extension recipe trained by Hugging Face transformers + PEFT, for comparison
with oomb on the same GPU (issue 37, item 3; run by bench/gpu_context_extension.sh hf).

    hf_context_extension.py init --model DIR --out ADAPTER_DIR
        PEFT's own initialisation of LoRA r=16 (alpha 32, every linear layer; A Kaiming-uniform
        with torch seed 0, B zero), saved, so that both trainers start from the same weights
        (oomb through method.lora.init_adapter).
    hf_context_extension.py train --model DIR --config BASE_CONFIG --init ADAPTER_DIR
        --train JSONL --val JSONL --length N --steps S --lr LR --warmup W
        Trains the adapter in bf16 with the base config oomb recorded (its YaRN RoPE), one sample
        per step in file order (oomb: data.shuffle_seed -1, packing off), each truncated to N
        tokens; AdamW (0.9, 0.999, 1e-8, no weight decay), oomb's warm-up + cosine schedule, the
        gradient norm clipped at 1.0, SDPA attention. Prints one JSON line per step ({"step",
        "loss", "seconds"}) and a last {"eval_loss"} over the first sample of --val, truncated
        to N tokens.
"""
import argparse
import json
import math
import time

import peft
import torch
import transformers

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def texts(path):
    return [json.loads(line)["text"] for line in open(path) if line.strip()]


def init(a):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    tuned = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    tuned.save_pretrained(a.out)


def learning_rate(a, step):  # worker/plan/lr_schedule.cc: warm-up, then cosine to 0
    if step < a.warmup:
        return a.lr * step / max(1, a.warmup)
    progress = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def train(a):
    dev = torch.device("cuda")
    config = transformers.AutoConfig.from_pretrained(a.config)
    base = transformers.AutoModelForCausalLM.from_pretrained(a.model, config=config, dtype=torch.bfloat16,
                                                             attn_implementation="sdpa").to(dev)
    model = peft.PeftModel.from_pretrained(base, a.init, is_trainable=True)
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    samples = [tok(t, return_tensors="pt").input_ids[:, :a.length] for t in texts(a.train)]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    model.train()
    for step in range(a.steps):
        ids = samples[step % len(samples)].to(dev)
        for g in opt.param_groups:
            g["lr"] = learning_rate(a, step)
        torch.cuda.synchronize()
        start = time.time()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print(json.dumps({"step": step + 1, "loss": loss.item(), "seconds": time.time() - start,
                          "tokens": ids.shape[1]}), flush=True)
    model.eval()
    ids = tok(texts(a.val)[0], return_tensors="pt").input_ids[:, :a.length].to(dev)
    with torch.no_grad():
        print(json.dumps({"eval_loss": model(input_ids=ids, labels=ids).loss.item(), "eval_tokens": ids.shape[1] - 1,
                          "peak_gpu_bytes": torch.cuda.max_memory_allocated()}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["init", "train"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out")
    ap.add_argument("--config")
    ap.add_argument("--init")
    ap.add_argument("--train")
    ap.add_argument("--val")
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    init(a) if a.what == "init" else train(a)


if __name__ == "__main__":
    main()
