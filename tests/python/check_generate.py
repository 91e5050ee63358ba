#!/usr/bin/env python3
"""oomb's greedy continuation equals transformers' on the real SmolLM2 model.

    check_generate.py OOMBD MODEL_DIR [--prompt TEXT] [--tokens N]
    check_generate.py OOMBD MODEL_DIR --prompt-file TEXT_FILE --prompt-chars N --chunk-tokens C --adapter

Runs `oombd model generate` and transformers' generate(do_sample=False) in float32 on the CPU
and compares the new token ids; exits 1 on any difference, 77 (skip) when the model is absent.
The second form gives oombd the first N characters of a text as --prompt-file, prefilled in
chunks of C tokens over the key/value cache, and (--adapter) a PEFT LoRA adapter made here with
random A and B on every linear layer, which transformers loads with peft.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_adapter(model, out_dir):
    import peft
    import torch
    torch.manual_seed(7)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                "up_proj", "down_proj"])
    tuned = peft.get_peft_model(model, config)
    with torch.no_grad():  # B is zero after PEFT's initialisation: draw it, so the adapter acts
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    tuned.save_pretrained(out_dir)
    return tuned


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("oombd")
    ap.add_argument("model")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--prompt-file")
    ap.add_argument("--prompt-chars", type=int, default=0)
    ap.add_argument("--chunk-tokens", type=int, default=4096)
    ap.add_argument("--adapter", action="store_true")
    ap.add_argument("--tokens", type=int, default=12)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"skip: no model at {a.model}")
        return 77
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    work = tempfile.mkdtemp()
    cmd = [a.oombd, "model", "generate", "--model", a.model, "--max-new-tokens", str(a.tokens),
           "--chunk-tokens", str(a.chunk_tokens)]
    prompt = a.prompt
    if a.prompt_file:
        prompt = open(a.prompt_file, encoding="utf-8").read()[:a.prompt_chars or None]
        with open(os.path.join(work, "prompt.txt"), "w", encoding="utf-8") as f:
            f.write(prompt)
        cmd += ["--prompt-file", os.path.join(work, "prompt.txt")]
    else:
        cmd += ["--prompt", prompt]
    if a.adapter:
        model = make_adapter(model, os.path.join(work, "adapter"))
        cmd += ["--adapter", os.path.join(work, "adapter")]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    ours = json.loads(out.stdout)
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == ours["prompt_ids"], "prompt tokens differ"
    print(f"prompt: {ids.shape[1]} tokens, prefilled in chunks of {a.chunk_tokens}"
          + (", with a random LoRA adapter" if a.adapter else ""))
    model.eval()
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.tokens,
                             do_sample=False)[0, ids.shape[1]:].tolist()
    print("transformers:", gen, repr(tok.decode(gen)))
    print("oomb:        ", ours["new_ids"], repr(ours["text"]))
    n = len(ours["new_ids"])
    if gen[:n] != ours["new_ids"]:
        print("FAIL: greedy continuations differ")
        return 1
    if a.adapter:  # the adapter must change the continuation, or the test could not tell
        base = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
        with torch.no_grad():
            plain = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.tokens,
                                  do_sample=False)[0, ids.shape[1]:].tolist()
        print("without the adapter:", plain)
        if plain[:n] == ours["new_ids"]:
            print("FAIL: the adapter changed nothing; the check cannot tell")
            return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
