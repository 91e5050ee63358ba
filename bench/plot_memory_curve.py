#!/usr/bin/env python3
"""Plots the GPU memory curve of a bench/gpu_metrics.sh run from its memory.csv (the /metrics
series the Grafana dashboard's memory panel shows): allocated, reserved and peak from the
caching allocator, NVML's device-wide used memory, and the KV / KV-gradient page bytes.

Usage: plot_memory_curve.py memory.csv out.png [title]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "GPU memory (from /metrics)"
    rows = list(csv.DictReader(open(src)))
    t = [float(r["seconds"]) for r in rows]
    fig, ax = plt.subplots(figsize=(10, 5))
    for key, label in [("nvml_used_bytes", "NVML used (all processes)"), ("reserved_bytes", "allocator reserved"),
                       ("peak_bytes", "allocator peak"), ("allocated_bytes", "allocator allocated"),
                       ("kv_grad_bytes", "KV-gradient pages (gpu tier)"), ("kv_bytes", "KV pages (gpu tier)")]:
        ys = [float(r[key]) / 2**30 if r[key] else None for r in rows]
        ax.plot(t, ys, label=label, marker=".")
    steps = [(float(r["seconds"]), r["step"]) for r in rows if r["step"]]
    for (t0, s0), (t1, s1) in zip(steps, steps[1:]):
        if s1 != s0:
            ax.axvline(t1, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("seconds (scrapes every ~1.2 s; dotted: an optimizer step finished)")
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
