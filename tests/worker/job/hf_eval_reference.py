"""Reference for eval_parity_test: tokenizes a text with the model's HF tokenizer, writes the
ids as pre-tokenized JSONL samples (so tokenization is not in question), and prints
transformers' mean next-token loss over all of them (float32, CPU) as JSON, with the loss by
position bucket ([0, 1024), [1024, 2048), [2048, 4096), ...: the loss of predicting the token
after position t counts in t's bucket) and how many next tokens are the logits' argmax (what
greedy decoding emits).

usage: hf_eval_reference.py MODEL_DIR TEXT_FILE OUT_JSONL LEN [LEN ...]
       OOMB_REF_YARN=FACTOR: the model with YaRN RoPE scaling of that factor over its window
"""
import json
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def bucket(t):
    return (t >> 10).bit_length()


def main():
    model_dir, text_file, out_path = sys.argv[1:4]
    lengths = [int(x) for x in sys.argv[4:]]
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(text_file, encoding="utf-8") as f:
        ids = tok(f.read(200000), add_special_tokens=False)["input_ids"]
    config = AutoConfig.from_pretrained(model_dir)
    if "OOMB_REF_YARN" in os.environ:
        factor = float(os.environ["OOMB_REF_YARN"])
        config.rope_parameters.update(rope_type="yarn", factor=factor,
                                      original_max_position_embeddings=config.max_position_embeddings)
        config.max_position_embeddings = int(config.max_position_embeddings * factor)
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    total, count, pos, hits = 0.0, 0, 0, 0
    buckets = {}
    with open(out_path, "w") as out:
        for n in lengths:
            sample = ids[pos:pos + n]
            pos += n
            out.write(json.dumps({"input_ids": sample}) + "\n")
            with torch.no_grad():
                t = torch.tensor([sample])
                logits = model(input_ids=t).logits[0, :-1].double()
            per_token = torch.nn.functional.cross_entropy(logits, t[0, 1:], reduction="none")
            hits += int((logits.argmax(-1) == t[0, 1:]).sum())
            total += float(per_token.sum())
            count += n - 1
            for i, loss in enumerate(per_token.tolist()):
                b = buckets.setdefault(bucket(i), [0.0, 0])
                b[0] += loss
                b[1] += 1
    positions = [{"bucket": k, "loss": s / c, "tokens": c} for k, (s, c) in sorted(buckets.items())]
    print(json.dumps({"loss": total / count, "tokens": count, "samples": len(lengths), "positions": positions,
                      "hits": hits}))


if __name__ == "__main__":
    main()
