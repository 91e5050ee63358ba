"""Reference for eval_parity_test: transformers' greedy continuation of a prompt (float32, CPU),
encoded as transformers encodes it (the tokenizer's special tokens included), printed as JSON
{"prompt_ids": [...], "new_ids": [...], "text": ...}.

usage: hf_generate_reference.py MODEL_DIR PROMPT MAX_NEW_TOKENS
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, prompt, max_new = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    new = out[0, len(ids):].tolist()
    print(json.dumps({"prompt_ids": ids, "new_ids": new, "text": tok.decode(new)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
