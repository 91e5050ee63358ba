"""Reference for eval_parity_test: tokenizes a text with the model's HF tokenizer, writes the
ids as pre-tokenized JSONL samples (so tokenization is not in question), and prints
transformers' mean next-token loss over all of them (float32, CPU) as JSON.

usage: hf_eval_reference.py MODEL_DIR TEXT_FILE OUT_JSONL LEN [LEN ...]
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, text_file, out_path = sys.argv[1:4]
    lengths = [int(x) for x in sys.argv[4:]]
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(text_file, encoding="utf-8") as f:
        ids = tok(f.read(200000), add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count, pos = 0.0, 0, 0
    with open(out_path, "w") as out:
        for n in lengths:
            sample = ids[pos:pos + n]
            pos += n
            out.write(json.dumps({"input_ids": sample}) + "\n")
            with torch.no_grad():
                t = torch.tensor([sample])
                loss = model(input_ids=t, labels=t).loss.double().item()
            total += loss * (n - 1)  # HF's loss is the mean over the n - 1 shifted labels
            count += n - 1
    print(json.dumps({"loss": total / count, "tokens": count, "samples": len(lengths)}))


if __name__ == "__main__":
    main()
