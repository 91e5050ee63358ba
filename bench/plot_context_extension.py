#!/usr/bin/env python3
"""Plots and tabulates bench/gpu_context_extension.sh: loss by position and passkey / needle
accuracy by length, before (native RoPE, YaRN x8 untrained) and after (dense- and
sparse-trained), and prints the figures the issue's targets name.

Usage: plot_context_extension.py out.png DIR
DIR holds ext_before_native.json, ext_before_yarn.json, ext_dense.jsonl, ext_sparse.jsonl (the
runs that exist are shown).
"""
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def evaluations(d):
    """label -> evaluation JSON (EvalReportJson: positions, passkey, needle)."""
    out = {}
    for tag, label in (("native", "before, native RoPE"), ("yarn", "before, YaRN x8")):
        p = os.path.join(d, f"ext_before_{tag}.json")
        if os.path.exists(p):
            out[label] = json.load(open(p))
    for mode in ("dense", "sparse"):
        p = os.path.join(d, f"ext_{mode}.jsonl")
        if os.path.exists(p):
            rows = [json.loads(line) for line in open(p) if line.strip()]
            ev = [r for r in rows if "evaluation" in r]
            if ev:
                out[f"after, {mode}-trained (step {ev[-1]['step']})"] = ev[-1]["evaluation"]
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
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    styles = ("-o", "-s", "-^", "-v")
    for (label, ev), style in zip(runs.items(), styles):
        pos = ev.get("positions", [])
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
    axes[0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct extended from 8K to 64K with YaRN x8 (LoRA r=16), "
                 + os.environ.get("OOMB_EXTENSION_GPU", "H100"))
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("| model | loss 4K-8K | loss 32K-64K | ratio | passkey 8K / 16K / 32K / 64K | needle 8K / 16K / 32K / 64K |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for label, ev in runs.items():
        pos = ev.get("positions", [])
        near, far = mean_loss(pos, 4096, 8192), mean_loss(pos, 32768, 65536)
        cells = []
        for suite in ("passkey", "needle"):
            acc = by_length(ev[suite]["cells"]) if suite in ev else {}
            cells.append(" / ".join(f"{100 * a:.0f}%" for a in acc.values()))
        print(f"| {label} | {near:.4f} | {far:.4f} | {far / near:.3f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
