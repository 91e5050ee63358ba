#!/usr/bin/env python3
"""Plots the dense-vs-sparse quality runs of bench/gpu_sparse_quality.sh: training loss per step
and validation loss at each evaluation, the runs side by side, and prints each run's eval losses
and its final gap to the first (dense) run.

Usage: plot_sparse_quality.py out.png LABEL=metrics.jsonl [LABEL=metrics.jsonl ...]
Environment: OOMB_QUALITY_GPU, the GPU the runs were made on, for the title (default: H200, the
first runs' GPU).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main():
    dst = sys.argv[1]
    runs = [(arg.split("=", 1)[0], load(arg.split("=", 1)[1])) for arg in sys.argv[2:]]
    fig, (train_ax, eval_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (name, rows), style in zip(runs, ("-o", "-s", "-^", "-v")):
        train_ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], style, label=name, markersize=3)
        ev = [r for r in rows if "eval_loss" in r]
        eval_ax.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], style, label=name)
    train_ax.set(title="training loss (64K-token Austen samples)", xlabel="step", ylabel="loss")
    eval_ax.set(title="validation loss (held-out 64K tokens of Persuasion)", xlabel="step", ylabel="loss")
    for ax in (train_ax, eval_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct, YaRN x8, LoRA r=16, " + os.environ.get("OOMB_QUALITY_GPU", "H200"))
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    evals = {name: [r["eval_loss"] for r in rows if "eval_loss" in r] for name, rows in runs}
    first = evals[runs[0][0]][-1]
    print(json.dumps({"eval_loss": evals, "final_gap_to_" + runs[0][0]: {n: e[-1] - first for n, e in evals.items()}}))


if __name__ == "__main__":
    main()
