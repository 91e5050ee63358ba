#!/usr/bin/env python3
"""Table and plot of the peers benchmark (bench/peers/peers.py), optionally beside oomb's results.

  python3 table.py PEERS.jsonl [PEERS2.jsonl ...] [--oomb OOMB.jsonl] [--plot peers.png]

peers.jsonl: the JSON lines peers.py prints ({"stack", "S", "tok_s", ...}, {"stack", "S", "oom"},
{"stack", "longest", ...}, {"stack", "error"}, probe and meta lines). Non-JSON lines are skipped.
--oomb: lines {"config", "S", "s_per_step", "tok_s"} (e.g. "config": "oomb defaults" /
"oomb best"); {"config", "S", "oom": true} and {"config", "longest": S} are read too.
When a (row, S) pair appears several times, the last line wins.

Prints a markdown table: one row per stack / oomb config, columns tok/s at each --columns length
(default 16K 64K 128K) and the longest context (from a --longest search; otherwise ">= the longest
length measured"). --plot FILE writes tokens/s against context length (log x axis), one line per
row; --longest probes that fit are drawn as hollow markers (one step, no warm-up at that length).
"""
import argparse
import json
import sys

STACK_ORDER = ["hf", "liger", "liger-offload", "hf-offload", "unsloth"]
STACK_LABEL = {"hf": "HF transformers + PEFT + GC", "liger": "+ Liger kernels",
               "liger-offload": "+ Liger + save_on_cpu offload", "hf-offload": "+ save_on_cpu offload", "unsloth": "Unsloth (offloaded GC)"}


def kfmt(S):
    if S is None:
        return "?"
    if S % 1024 == 0:
        return f"{S // 1024}K"
    return str(S)


def read_lines(paths, key, rows=None):
    rows = {} if rows is None else rows
    for path in paths:
        read_file(path, key, rows)
    return rows


def read_file(path, key, rows):
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except ValueError:
                print(f"{path}:{n}: not JSON, skipped", file=sys.stderr)
                continue
            name = d.get(key)
            if name is None or d.get("meta"):
                continue
            r = rows.setdefault(name, {"points": {}, "probes": {}, "longest": None, "oom_at": None,
                                       "errors": []})
            if "longest" in d:
                r["longest"] = d["longest"]
                r["oom_at"] = d.get("oom_at")
            elif "error" in d:
                r["errors"].append(d["error"])
            elif "S" in d and d.get("probe"):
                r["probes"][d["S"]] = d
            elif "S" in d:
                r["points"][d["S"]] = d


def cell(r, S):
    d = r["points"].get(S)
    if d is None:
        return "—"
    if d.get("oom"):
        return "OOM"
    if d.get("tok_s") is not None:
        return f"{d['tok_s']:,.0f}"
    if d.get("s_per_step"):
        return f"{S / d['s_per_step']:,.0f}"
    return "?"


def longest_cell(r):
    if r["longest"] is not None:
        if r["longest"] == 0:
            return f"< {kfmt(r['oom_at'])}" if r["oom_at"] else "none fit"
        return kfmt(r["longest"]) + (f" (OOM at {kfmt(r['oom_at'])})" if r["oom_at"] else "")
    fit = [S for S, d in r["points"].items() if not d.get("oom") and "error" not in d]
    fit += [S for S, d in r["probes"].items() if d.get("fits")]
    return f"≥ {kfmt(max(fit))}" if fit else "—"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peers", nargs="+", help="peers.jsonl file(s) written by run_peers.sh / peers.py "
                                              "(several: e.g. one per device call)")
    ap.add_argument("--oomb", nargs="+", help="oomb results: lines {config, S, s_per_step, tok_s}")
    ap.add_argument("--columns", type=int, nargs="+", default=[16384, 65536, 131072])
    ap.add_argument("--plot", metavar="FILE", help="write a PNG plot of tokens/s against length")
    ap.add_argument("--title", default="LoRA training throughput vs context length")
    args = ap.parse_args()

    stacks = read_lines(args.peers, "stack")
    oomb = read_lines(args.oomb, "config") if args.oomb else {}
    order = [s for s in STACK_ORDER if s in stacks] + sorted(s for s in stacks if s not in STACK_ORDER)
    rows = [(STACK_LABEL.get(s, s) + f" [{s}]", stacks[s]) for s in order]
    rows += [(c, oomb[c]) for c in oomb]

    head = ["stack"] + [f"tok/s @ {kfmt(S)}" for S in args.columns] + ["longest context"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] + ["---:"] * len(args.columns) + ["---:"]) + "|")
    for name, r in rows:
        cells = [cell(r, S) for S in args.columns] + [longest_cell(r)]
        if r["errors"] and not r["points"]:
            cells = ["error"] * len(args.columns) + ["—"]
        print("| " + " | ".join([name] + cells) + " |")
    notes = [(name, e) for name, r in rows for e in r["errors"]]
    if notes:
        print()
        for name, e in notes:
            print(f"- {name}: {e.splitlines()[0][:300]}")

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
        all_S = set()
        for i, (name, r) in enumerate(rows):
            color = f"C{i % 10}"
            pts = sorted((S, d["tok_s"]) for S, d in r["points"].items() if d.get("tok_s"))
            probes = sorted((S, S / d["s_per_step"]) for S, d in r["probes"].items()
                            if d.get("fits") and d.get("s_per_step"))
            if not pts and not probes and not r["longest"]:
                continue
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=name)
            else:
                ax.plot([], [], "o-", color=color, label=name)
            if probes:
                ax.plot([p[0] for p in probes], [p[1] for p in probes], "o", color=color,
                        markerfacecolor="none")
            if r["longest"]:
                ax.axvline(r["longest"], color=color, linestyle=":", linewidth=1)
                all_S.add(r["longest"])
            all_S.update(S for S, _ in pts + probes)
        ax.set_xscale("log", base=2)
        if all_S:
            ticks = sorted(all_S)
            ax.set_xticks(ticks)
            ax.set_xticklabels([kfmt(S) for S in ticks], rotation=45 if len(ticks) > 6 else 0)
            ax.minorticks_off()
        ax.set_xlabel("context length (tokens, log scale)")
        ax.set_ylabel("tokens / s (forward + backward)")
        ax.set_ylim(bottom=0)
        ax.set_title(args.title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.text(0.99, 0.01, "hollow: --longest probe (no warm-up); dotted: longest that fits",
                 ha="right", va="bottom", fontsize=7, color="gray")
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"\nplot: {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
