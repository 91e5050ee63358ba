#!/usr/bin/env python3
"""Checks that an adapter oomb saved loads in PEFT and computes what oomb computed.

    check_peft_adapter.py MODEL_DIR ADAPTER_DIR

MODEL_DIR: a tiny model of tests/python/make_tiny_models.py (its reference.safetensors holds the
input ids). ADAPTER_DIR: oomb's adapter (adapter_config.json, adapter_model.safetensors) and
oomb_logits.safetensors, oomb's logits [seq, vocab] for those ids with the adapter. PEFT passes
when it loads every adapter weight, and no other, and its logits are within 1e-4 of oomb's.

Checked with the venv's PEFT, then with each other PEFT release installed beside it: a
`pip install --no-deps --target VENV/peft-VERSION peft==VERSION` directory (VENV: this Python's
sys.prefix), run in a child process with that directory first on PYTHONPATH. PEFT 0.21 and 0.22
read a mixture of experts' target_modules differently (worker/model/transformer.h, SaveLora), so
the older release is the one that tells whether oomb's config is read alike. Prints one line
per release checked (and which were found); exits 0 when every one passes, 1 otherwise, saying
why.
"""

import glob
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CHILD = "OOMB_CHECK_PEFT_CHILD"  # set in the child processes: check this interpreter's PEFT only


def check(model_dir, adapter_dir):
    """0 when this interpreter's PEFT loads the adapter as oomb saved it and gives oomb's logits."""
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file

    transformers.utils.logging.set_verbosity_error()
    where = f"check_peft_adapter: {os.path.basename(model_dir)}: peft {peft.__version__}"
    with open(os.path.join(model_dir, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    base = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    tuned = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    loaded = {n.replace(".default", ""): p for n, p in tuned.named_parameters() if "lora_" in n}
    if set(saved) != set(loaded):
        print(f"{where}: PEFT's LoRA weights {sorted(set(loaded) ^ set(saved))[:4]} differ from the file's "
              f"({len(loaded)} against {len(saved)})", file=sys.stderr)
        return 1
    for name, t in saved.items():
        if not torch.equal(loaded[name].detach(), t):
            print(f"{where}: {name} loaded with other values", file=sys.stderr)
            return 1
    ids = load_file(os.path.join(model_dir, "reference.safetensors"))["input_ids"]
    with torch.no_grad():
        logits = tuned(input_ids=ids).logits[0].float()
    want = load_file(os.path.join(adapter_dir, "oomb_logits.safetensors"))["logits"]
    diff = (logits - want).abs().max().item()
    print(f"{where}: {len(saved)} LoRA weights, max |logit difference| {diff:.2e}")
    return 0 if diff <= 1e-4 else 1


def main():
    model_dir, adapter_dir = sys.argv[1], sys.argv[2]
    rc = check(model_dir, adapter_dir)
    if os.environ.get(CHILD):
        return rc
    others = sorted(glob.glob(os.path.join(sys.prefix, "peft-*")))
    if not others:
        print(f"check_peft_adapter: no other PEFT release under {sys.prefix}/peft-*: the venv's only")
    for path in others:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])))
        env[CHILD] = "1"
        rc |= subprocess.run([sys.executable, os.path.abspath(__file__), model_dir, adapter_dir], env=env).returncode
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
