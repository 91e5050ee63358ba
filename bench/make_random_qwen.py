#!/usr/bin/env python3
"""Writes, on the GPU machine (nothing of that size can be carried or downloaded), a Qwen2.5
model with random bf16 weights in Hugging Face format, and pre-tokenized samples of random ids.

Usage: make_random_qwen.py WORK_DIR SEQ_LEN [SAMPLES] [SIZE]
         ->  WORK_DIR/model/, WORK_DIR/train.jsonl
SIZE: 0.5b (default; Qwen2.5-0.5B's shape) or 7b (Qwen2.5-7B's shape, built on the GPU when
there is one: about 15 GB written).
"""
import json
import sys

import torch
import transformers

SHAPES = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}


def main():
    work, seq_len = sys.argv[1], int(sys.argv[2])
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    size = sys.argv[4] if len(sys.argv) > 4 else "0.5b"
    cfg = transformers.Qwen2Config(**SHAPES[size], rope_theta=1e6, max_position_embeddings=max(32768, seq_len))
    torch.manual_seed(0)
    device = "cuda" if size != "0.5b" and torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(cfg)
    model.save_pretrained(work + "/model")
    g = torch.Generator().manual_seed(0)
    with open(work + "/train.jsonl", "w") as f:
        for _ in range(samples):
            f.write(json.dumps({"input_ids": torch.randint(0, 151000, (seq_len,), generator=g).tolist()}) + "\n")


if __name__ == "__main__":
    main()
