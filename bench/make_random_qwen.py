#!/usr/bin/env python3
"""Writes, on the GPU machine (nothing of that size can be carried or downloaded), a
Qwen2.5-0.5B-shaped model with random bf16 weights in Hugging Face format, and pre-tokenized
samples of random ids.

Usage: make_random_qwen.py WORK_DIR SEQ_LEN [SAMPLES]   ->  WORK_DIR/model/, WORK_DIR/train.jsonl
"""
import json
import sys

import torch
import transformers


def main():
    work, seq_len = sys.argv[1], int(sys.argv[2])
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6,
                                   max_position_embeddings=max(32768, seq_len), tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(work + "/model")
    g = torch.Generator().manual_seed(0)
    with open(work + "/train.jsonl", "w") as f:
        for _ in range(samples):
            f.write(json.dumps({"input_ids": torch.randint(0, 151000, (seq_len,), generator=g).tolist()}) + "\n")


if __name__ == "__main__":
    main()
