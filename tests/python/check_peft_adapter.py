#!/usr/bin/env python3
"""Checks that an adapter oomb saved loads in PEFT and computes what oomb computed.

    check_peft_adapter.py MODEL_DIR ADAPTER_DIR

MODEL_DIR: a tiny model of tests/python/make_tiny_models.py (its reference.safetensors holds the
input ids). ADAPTER_DIR: oomb's adapter (adapter_config.json, adapter_model.safetensors) and
oomb_logits.safetensors, oomb's logits [seq, vocab] for those ids with the adapter. Exits 0 when
PEFT loads every adapter weight and its logits are within 1e-4 of oomb's; 1 otherwise, saying why.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    model_dir, adapter_dir = sys.argv[1], sys.argv[2]
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file

    transformers.utils.logging.set_verbosity_error()
    with open(os.path.join(model_dir, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    base = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    tuned = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    loaded = {n.replace(".default", ""): p for n, p in tuned.named_parameters() if "lora_" in n}
    if set(saved) != set(loaded):
        print(f"check_peft_adapter: PEFT's LoRA weights {sorted(set(loaded) ^ set(saved))[:4]} differ from the "
              f"file's", file=sys.stderr)
        return 1
    for name, t in saved.items():
        if not torch.equal(loaded[name].detach(), t):
            print(f"check_peft_adapter: {name} loaded with other values", file=sys.stderr)
            return 1
    ids = load_file(os.path.join(model_dir, "reference.safetensors"))["input_ids"]
    with torch.no_grad():
        logits = tuned(input_ids=ids).logits[0].float()
    want = load_file(os.path.join(adapter_dir, "oomb_logits.safetensors"))["logits"]
    diff = (logits - want).abs().max().item()
    print(f"check_peft_adapter: {os.path.basename(model_dir)}: {len(saved)} LoRA weights, max |logit difference| "
          f"{diff:.2e}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
