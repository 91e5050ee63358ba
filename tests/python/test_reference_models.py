#!/usr/bin/env python3
"""Checks the test data that scripts/fetch_test_data.sh prepared. Plain script (no pytest):
prints each check and exits non-zero if any fails.

    test_reference_models.py [--data DIR]      DIR defaults to ${OOMB_DATA_DIR:-~/.cache/oomb/data}

(a) models/SmolLM2-135M-Instruct and models/gemma-3-270m (converted by scripts/gguf_to_hf.py)
    against transformers' own GGUF loader on the same GGUF file: every weight, the logits on a
    fixed prompt, and the tokenizer on a few sentences (and SmolLM2's chat template);
(b) the greedy continuation of "The capital of France is" (printed; must mention Paris).
(c) texts/austen: six novels, each > 100K SmolLM2 tokens; the other texts present.
(d) tiny/: every tiny model reloads and reproduces its reference.safetensors.
"""

import argparse
import glob
import json
import os
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws a tqdm bar

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never ask the Hugging Face hub

FAILURES = []


def check(ok, what):
    print(f"[{'PASS' if ok else 'FAIL'}] {what}", flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def find_gguf(data, name):
    hits = glob.glob(os.path.join(data, "downloads", "**", name), recursive=True)
    return hits[0] if hits else None


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It is a truth universally acknowledged, that a single man in possession\n"
    "of a good fortune, must be in want of a wife.",
    "In 2024, 12345 people paid $3.50 each -- naïve café façade, 東京, emoji 🙂.",
    "def f(x):\n    return x ** 2  # comment\n\n\tTabs and  double  spaces",
]


def compare_with_gguf_loader(hf_dir, gguf_path, prompt):
    """Our converted directory against transformers loading the GGUF itself: the same parameter
    names and values, the same logits on `prompt` and the same tokenizer. Returns both models and
    both tokenizers (None, None, None, None when a file is missing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not check(os.path.isfile(os.path.join(hf_dir, "model.safetensors")), f"converted model in {hf_dir}"):
        return None, None, None, None
    if not check(gguf_path is not None, f"GGUF file for {hf_dir}"):
        return None, None, None, None
    torch.manual_seed(0)
    t0 = time.time()
    ours = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    theirs = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    print(f"      loaded both models in {time.time() - t0:.1f}s")

    sd_ours, sd_theirs = ours.state_dict(), theirs.state_dict()
    check(sorted(sd_ours) == sorted(sd_theirs), f"same parameter names ({len(sd_ours)})")
    worst, worst_name = 0.0, None
    for k in sd_ours:
        if k in sd_theirs:
            d = (sd_ours[k] - sd_theirs[k]).abs().max().item()
            if d > worst:
                worst, worst_name = d, k
    check(worst <= 1e-6, f"weights equal: max |diff| {worst:.3g}{f' ({worst_name})' if worst_name else ''}")

    tok_ours = AutoTokenizer.from_pretrained(hf_dir)
    tok_theirs = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    ids = torch.tensor([tok_ours.encode(prompt)])
    with torch.no_grad():
        lo = ours(ids).logits.float()
        lt = theirs(ids).logits.float()
    diff = (lo - lt).abs().max().item()
    # Both sides dequantize the same bits to float32 (the weights compare equal above), so the two
    # forwards are the same float32 program; only kernel-level summation order can differ, which
    # over 30 layers stays ~1e-5 on logits of magnitude ~10-30. 1e-4 leaves 10x margin and is
    # still far below what any real conversion bug (a wrong permutation, nibble order, tied head,
    # a norm's offset) produces (O(1)).
    check(diff <= 1e-4, f"logits vs transformers' GGUF loader on {ids.shape[1]} tokens: max |diff| {diff:.3g} "
          f"(logit range {lo.min().item():.1f}..{lo.max().item():.1f}) <= 1e-4")
    check(torch.equal(lo.argmax(-1), lt.argmax(-1)), "argmax tokens identical")
    same = [tok_ours.encode(s) == tok_theirs.encode(s) for s in SENTENCES]
    check(all(same), f"tokenizer encodes {len(SENTENCES)} sentences identically to the GGUF-loaded one ({same})")
    return ours, theirs, tok_ours, tok_theirs


def test_smollm2(data):
    hf_dir = os.path.join(data, "models", "SmolLM2-135M-Instruct")
    gguf_path = find_gguf(data, "SmolLM2-135M-Instruct.Q4_1.gguf")
    prompt = "Long-context fine-tuning keeps the key-value cache of every past chunk. In 2024, 3 people wrote"
    ours, _, tok_ours, tok_theirs = compare_with_gguf_loader(hf_dir, gguf_path, prompt)
    if ours is None:
        return None, None
    chat_turn = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    check(tok_ours.encode(chat_turn) == tok_theirs.encode(chat_turn), "tokenizer encodes a chat turn identically")
    check(all(tok_ours.decode(tok_ours.encode(s)) == s for s in SENTENCES), "tokenizer round-trips the sentences")
    chat = [{"role": "user", "content": "What is 2+2?"}]
    a = tok_ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    b = tok_theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    check(a == b and "<|im_start|>assistant\n" in a, "chat template renders like the GGUF-loaded tokenizer")
    check(
        (tok_ours.bos_token, tok_ours.eos_token, tok_ours.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>"),
        f"special tokens bos/eos/pad = {tok_ours.bos_token}/{tok_ours.eos_token}/{tok_ours.pad_token}",
    )
    return ours, tok_ours


def test_gemma3(data):
    """Gemma-3-270M: sliding-window and global layers, (1 + w) norms, K-quants (Q4_K, Q6_K) and
    Q5_0 / Q8_0 in one file."""
    hf_dir = os.path.join(data, "models", "gemma-3-270m")
    gguf_path = find_gguf(data, "gemma-3-270m-q4_k_m.gguf")
    prompt = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    ours, _, tok, _ = compare_with_gguf_loader(hf_dir, gguf_path, prompt)
    if ours is not None:
        check(ours.config.sliding_window == 512 and ours.config.layer_types.count("full_attention") == 3,
              f"gemma-3-270m: window {ours.config.sliding_window}, layer types {ours.config.layer_types}")
        test_generation(ours, tok, "Paris is the capital of", "france")


def test_generation(model, tok, prompt="The capital of France is", want="paris"):
    import torch

    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    cont = tok.decode(out[0, ids.shape[1]:])
    print(f"      greedy: {prompt!r} -> {cont!r}")
    check(want in cont.lower(), f"greedy continuation mentions {want!r}")


def test_texts(data, tok):
    austen = sorted(glob.glob(os.path.join(data, "texts", "austen", "*.txt")))
    check(len(austen) == 6, f"six Austen novels ({[os.path.basename(p) for p in austen]})")
    for p in austen:
        text = open(p, encoding="utf-8").read()
        n = len(tok.encode(text)) if tok is not None else None
        if n is None:
            check(False, f"{os.path.basename(p)}: no tokenizer to count tokens")
        else:
            check(n > 100_000, f"{os.path.basename(p)}: {len(text):,} chars, {n:,} SmolLM2 tokens > 100K")
    for name in ("python-docs.txt", "bible-kjv.txt", "jargon.txt"):
        p = os.path.join(data, "texts", name)
        size = len(open(p, encoding="utf-8").read()) if os.path.exists(p) else 0
        check(size > 1_000_000, f"{name}: {size:,} chars > 1M")


def test_tiny(data):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root = os.path.join(data, "tiny")
    mpath = os.path.join(root, "manifest.json")
    if not check(os.path.exists(mpath), f"{mpath} present"):
        return
    manifest = json.load(open(mpath))
    for m in manifest["models"]:
        d = os.path.join(root, m["name"])
        ref = load_file(os.path.join(d, "reference.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            out = model(ref["input_ids"], labels=ref["input_ids"])
        diff = (out.logits - ref["logits"]).abs().max().item()
        loss = out.loss.item()
        if "router_aux_loss" in ref:  # transformers' loss adds the router's auxiliary loss; the reference keeps both
            loss -= model.config.router_aux_loss_coef * out.aux_loss.item()
            check(abs(out.aux_loss.item() - ref["router_aux_loss"].item()) <= 1e-5,
                  f"tiny {m['name']}: router aux loss")
        dl = abs(loss - ref["loss"].item())
        check(diff <= 1e-5 and dl <= 1e-5, f"tiny {m['name']}: logits |diff| {diff:.2g}, loss {ref['loss'].item():.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("OOMB_DATA_DIR", os.path.expanduser("~/.cache/oomb/data")))
    a = ap.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    model, tok = test_smollm2(a.data)
    if model is not None:
        test_generation(model, tok)
    test_gemma3(a.data)
    test_texts(a.data, tok)
    test_tiny(a.data)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed:", *FAILURES, sep="\n  ")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
