#!/usr/bin/env python3
"""Plots and tabulates bench/gpu_context_extension.sh: loss by position and passkey / needle
accuracy by length, before (native RoPE, YaRN x8 untrained) and after (dense- and
sparse-trained), and prints the figures the issue's targets name.

Usage: plot_context_extension.py out.png DIR
DIR holds ext_before_native.json, ext_before_yarn.json, ext_{dense,sparse}[_mixed].jsonl (the
runs that exist are shown). With ext_hf_oomb.jsonl and ext_hf_peft.jsonl there (the `hf` call),
also out_peft.png: the two trainers' loss per step at 32K, and their largest relative gap.
"""
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def buckets(ev):
    """The positions suite's buckets: {"positions": {"buckets": [...]}} (EvalReportJson), or the
    bare list the results committed before the suites became a map hold."""
    pos = ev.get("positions", {})
    return pos if isinstance(pos, list) else pos.get("buckets", [])


def evaluations(d):
    """label -> evaluation JSON (EvalReportJson: positions, passkey, needle)."""
    out = {}
    for tag, label in (("native", "before, native RoPE"), ("yarn", "before, YaRN x8")):
        p = os.path.join(d, f"ext_before_{tag}.json")
        if os.path.exists(p):
            out[label] = json.load(open(p))
    for tag, label in (("dense", "dense-trained"), ("sparse", "sparse-trained"),
                       ("dense_mixed", "dense-trained, retrieval mixed in"),
                       ("sparse_mixed", "sparse-trained, retrieval mixed in")):
        p = os.path.join(d, f"ext_{tag}.jsonl")
        if os.path.exists(p):
            rows = [json.loads(line) for line in open(p) if line.strip()]
            ev = [r for r in rows if "evaluation" in r]
            if ev:
                out[f"after, {label} (step {ev[-1]['step']})"] = ev[-1]["evaluation"]
    return out


def by_length(cells):
    acc = defaultdict(lambda: [0, 0])
    for c in cells:
        acc[c["length"]][0] += c["correct"]
        acc[c["length"]][1] += c["trials"]
    return {k: v[0] / v[1] for k, v in sorted(acc.items())}


def mean_loss(positions, begin, end):
    """Token-weighted mean loss over the buckets inside [begin, end)."""
    b = [p for p in positions if p["begin"] >= begin and p["end"] <= end and p["tokens"] > 0]
    n = sum(p["tokens"] for p in b)
    return sum(p["loss"] * p["tokens"] for p in b) / n if n else float("nan")


def main():
    dst, d = sys.argv[1], sys.argv[2]
    runs = evaluations(d)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    styles = ("-o", "-s", "-^", "-v", "--^", "--v")
    for (label, ev), style in zip(runs.items(), styles):
        pos = buckets(ev)
        axes[0].plot([(p["begin"] + p["end"]) / 2 for p in pos], [p["loss"] for p in pos], style, label=label,
                     markersize=4)
        for ax, suite in ((axes[1], "passkey"), (axes[2], "needle")):
            if suite in ev:
                acc = by_length(ev[suite]["cells"])
                ax.plot(list(acc), [100 * a for a in acc.values()], style, label=label, markersize=4)
    axes[0].set(xscale="log", xlabel="position in the 64K held-out sample (bucket middle)",
                ylabel="mean next-token loss (nats)", title="Loss by position (Persuasion, held out)")
    axes[0].set_ylim(top=min(axes[0].get_ylim()[1], 8))
    for ax, suite in ((axes[1], "passkey"), (axes[2], "needle")):
        ax.set(xscale="log", xlabel="document length (tokens)", ylabel="exact-match accuracy (%)",
               title=f"{suite}, 5 depths x 2 trials", ylim=(-5, 105))
    for ax in axes:
        ax.axvline(8192, color="gray", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct extended from 8K to 64K with YaRN x8 (LoRA r=16), "
                 + os.environ.get("OOMB_EXTENSION_GPU", "H100"))
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("| model | loss 4K-8K | loss 32K-64K | ratio | passkey 8K / 16K / 32K / 64K | needle 8K / 16K / 32K / 64K |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for label, ev in runs.items():
        pos = buckets(ev)
        near, far = mean_loss(pos, 4096, 8192), mean_loss(pos, 32768, 65536)
        cells = []
        for suite in ("passkey", "needle"):
            acc = by_length(ev[suite]["cells"]) if suite in ev else {}
            cells.append(" / ".join(f"{100 * a:.0f}%" for a in acc.values()))
        print(f"| {label} | {near:.4f} | {far:.4f} | {far / near:.3f} | {cells[0]} | {cells[1]} |")
    compare_peft(dst, d)


def compare_peft(dst, d):
    oomb_path, peft_path = os.path.join(d, "ext_hf_oomb.jsonl"), os.path.join(d, "ext_hf_peft.jsonl")
    if not (os.path.exists(oomb_path) and os.path.exists(peft_path)):
        return
    ours = [json.loads(line) for line in open(oomb_path) if line.strip()]
    theirs = [json.loads(line) for line in open(peft_path) if line.strip()]
    steps = [r for r in theirs if "step" in r]
    gap = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(ours, steps))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([r["step"] for r in ours], [r["loss"] for r in ours], "-o", label="oomb", markersize=4)
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], "--s", label="transformers + PEFT", markersize=3)
    ax.set(xlabel="step", ylabel="training loss (nats)",
           title=f"32K tokens, the same adapter at step 0: largest gap {100 * gap:.3f}%")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst.replace(".png", "_peft.png"), dpi=110)
    evals = [r for r in ours if "eval_loss" in r]
    peft_eval = [r for r in theirs if "eval_loss" in r]
    print(f"oomb vs transformers + PEFT at 32K: largest per-step loss gap {100 * gap:.4f}%"
          + (f"; eval loss {evals[-1]['eval_loss']:.5f} vs {peft_eval[-1]['eval_loss']:.5f}" if evals and peft_eval
             else ""))


if __name__ == "__main__":
    main()
