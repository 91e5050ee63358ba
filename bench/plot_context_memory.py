#!/usr/bin/env python3
"""Plots peak GPU memory and pinned host memory against context length from bench_train JSON
lines (one file per placement, e.g. --kv-offload none and host), and prints the fitted GPU slope
in MB per 10K tokens of each.

Usage: plot_context_memory.py out.png LABEL=file.jsonl [LABEL=file.jsonl ...]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        if "S" in r and "peak_bytes" in r:
            out.append(r)
    return sorted(out, key=lambda r: r["S"])


def slope_mb_per_10k(rs):
    """Least-squares slope of peak GPU bytes against tokens, in MB (1e6 bytes) per 10,000 tokens."""
    if len(rs) < 2:
        return float("nan")
    xs = [r["S"] for r in rs]
    ys = [r["peak_bytes"] for r in rs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return b * 1e4 / 1e6


def main():
    dst = sys.argv[1]
    fig, ax = plt.subplots(figsize=(9, 5))
    for arg in sys.argv[2:]:
        label, path = arg.split("=", 1)
        rs = rows(path)
        xs = [r["S"] / 1024 for r in rs]
        ax.plot(xs, [r["peak_bytes"] / 2**30 for r in rs], marker="o", label=f"{label}: peak GPU allocated")
        if any(r.get("host_pinned_bytes", 0) for r in rs):
            ax.plot(xs, [r.get("host_pinned_bytes", 0) / 2**30 for r in rs], marker="s", linestyle="--",
                    label=f"{label}: pinned host (KV + KV-gradient pages)")
        print(f"{label}: GPU slope {slope_mb_per_10k(rs):.1f} MB per 10K tokens over "
              f"{[r['S'] for r in rs]}")
    ax.set_xlabel("context (K tokens)")
    ax.set_ylabel("GiB")
    ax.set_title("Qwen2.5-7B LoRA r=16, bf16: memory against context")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main()
