#!/usr/bin/env python3
"""oomb's greedy continuation equals transformers' on the real SmolLM2 model.

    check_generate.py OOMBD MODEL_DIR [--prompt TEXT] [--tokens N]

Runs `oombd model generate` and transformers' generate(do_sample=False) in float32 on the CPU
and compares the new token ids; exits 1 on any difference, 77 (skip) when the model is absent.
"""
import argparse, json, os, subprocess, sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("oombd")
    ap.add_argument("model")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--tokens", type=int, default=12)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"skip: no model at {a.model}")
        return 77
    out = subprocess.run([a.oombd, "model", "generate", "--model", a.model, "--prompt", a.prompt,
                          "--max-new-tokens", str(a.tokens)], check=True, capture_output=True, text=True)
    ours = json.loads(out.stdout)
    import torch, transformers
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    ids = tok(a.prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == ours["prompt_ids"], (ids[0].tolist(), ours["prompt_ids"])
    gen = model.generate(ids, max_new_tokens=a.tokens, do_sample=False)[0, ids.shape[1]:].tolist()
    print("transformers:", gen, repr(tok.decode(gen)))
    print("oomb:        ", ours["new_ids"], repr(ours["text"]))
    n = len(ours["new_ids"])
    if gen[:n] != ours["new_ids"]:
        print("FAIL: greedy continuations differ")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
