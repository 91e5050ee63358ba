#!/usr/bin/env python3
"""Plots the dense-vs-sparse quality run of bench/gpu_sparse_quality.sh: training loss per step
and validation loss at each evaluation, both runs side by side, and prints the eval-loss gap.

Usage: plot_sparse_quality.py quality_dense.jsonl quality_sparse.jsonl out.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main():
    dense, sparse, dst = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
    fig, (train_ax, eval_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for rows, name, style in ((dense, "dense", "-o"), (sparse, "sparse (64 pages of 128)", "-s")):
        train_ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], style, label=name, markersize=3)
        ev = [r for r in rows if "eval_loss" in r]
        eval_ax.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], style, label=name)
    train_ax.set(title="training loss (64K-token Austen samples)", xlabel="step", ylabel="loss")
    eval_ax.set(title="validation loss (held-out 64K tokens of Persuasion)", xlabel="step", ylabel="loss")
    for ax in (train_ax, eval_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct, YaRN x8, LoRA r=16, H200")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    d = [r["eval_loss"] for r in dense if "eval_loss" in r]
    s = [r["eval_loss"] for r in sparse if "eval_loss" in r]
    print(json.dumps({"dense_eval_loss": d, "sparse_eval_loss": s, "final_gap_sparse_minus_dense": s[-1] - d[-1]}))


if __name__ == "__main__":
    main()
