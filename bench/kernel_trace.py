#!/usr/bin/env python3
"""Summarizes bench_train --kernel-trace files (bench/kernel_trace.h): where a window of a step's
GPU time went, and, given a second trace, what changed between the two.

For each trace: the window's length, how busy the trainer's stream was (the stream with the most
kernels), how busy the copy engine's fetch (CopyRunsKernel) and addition (AddRunsKernel) kernels
were, and the trainer stream's idle gaps by length, split into gaps that end when a fetch or an
upload lands (the stream waited for it) and the rest (the stream waited for the host to queue
work).

With two traces (a base, e.g. 128K tokens, and another, e.g. the maximum context): the trainer
stream's kernel time per unit of work (one cuDNN flash backward, once per layer of a chunk in
stage 2), split into the same kernels running slower and extra kernels; the kernels whose time
per unit grew most; and the slowdown split by what ran beside each kernel (an addition, a fetch,
neither).

Usage: bench/kernel_trace.py TRACE.tsv[.gz] [OTHER.tsv[.gz]]
"""
import bisect
import collections
import csv
import gzip
import sys

Row = collections.namedtuple("Row", "start end stream kind name grid bytes")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = []
        for r in csv.DictReader(f, delimiter="\t"):
            start, end = int(r["start_ns"]), int(r["end_ns"])
            if start <= 0 or end < start:  # CUPTI's records without timestamps
                continue
            rows.append(Row(start, end, r["stream"], r["kind"], r["name"], int(r["grid"]), int(r["bytes"])))
    t0 = min(r.start for r in rows)
    return [r._replace(start=r.start - t0, end=r.end - t0) for r in rows]


def trainer_stream(rows):
    return collections.Counter(r.stream for r in rows if r.kind == "kernel").most_common(1)[0][0]


def merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


class Busy:
    """The union of some records' intervals, for overlap queries."""

    def __init__(self, rows):
        self.iv = merged((r.start, r.end) for r in rows)
        self.starts = [s for s, _ in self.iv]

    def total(self):
        return sum(e - s for s, e in self.iv)

    def overlap(self, s, e):
        i, got = bisect.bisect_right(self.starts, e) - 1, 0
        while i >= 0 and self.iv[i][1] > s:
            got += max(0, min(e, self.iv[i][1]) - max(s, self.iv[i][0]))
            i -= 1
        return got


def short(name):
    for key in ("CopyRuns", "AddRuns", "GatherSelected", "AccumulateSelected", "flash_bprop", "flash_fprop"):
        if key in name:
            return key
    return name[:70]


def summarize(path):
    rows = load(path)
    stream = trainer_stream(rows)
    trainer = sorted((r for r in rows if r.stream == stream), key=lambda r: r.start)
    span = max(r.end for r in rows)
    fetches = Busy(r for r in rows if "CopyRuns" in r.name)
    adds = Busy(r for r in rows if "AddRuns" in r.name)
    print(f"{path}: {len(rows)} records, {span / 1e6:.1f} ms; trainer stream {stream} busy "
          f"{100 * Busy(trainer).total() / span:.1f}%, fetch kernels {100 * fetches.total() / span:.1f}%, "
          f"addition kernels {100 * adds.total() / span:.1f}%")
    landed = sorted(r.end for r in rows if r.stream != stream and ("CopyRuns" in r.name or r.kind == "memcpy"))
    by_length, waited = collections.Counter(), collections.Counter()
    end = trainer[0].end
    for r in trainer[1:]:
        if r.start > end:
            gap = r.start - end
            bucket = next(b for limit, b in ((5e3, "<5us"), (2e4, "<20us"), (1e5, "<100us"), (1e6, "<1ms"),
                                             (float("inf"), ">=1ms")) if gap < limit)
            by_length[bucket] += gap / 1e6
            i = bisect.bisect_left(landed, end)
            waited["a copy" if i < len(landed) and landed[i] <= r.start < landed[i] + 8000 else "the host"] += gap / 1e6
        end = max(end, r.end)
    print("  trainer stream idle (ms) by gap length:", {k: round(v, 1) for k, v in by_length.items()},
          "waiting for:", {k: round(v, 1) for k, v in waited.items()})
    return rows, stream, fetches, adds


def per_kernel(rows, stream, fetches, adds):
    """name -> [(seconds, overlap share with additions, with fetches)] on the trainer stream."""
    out = collections.defaultdict(list)
    for r in rows:
        if r.stream == stream and r.end > r.start:
            d = r.end - r.start
            out[r.name].append((d / 1e9, adds.overlap(r.start, r.end) / d, fetches.overlap(r.start, r.end) / d))
    return out


def compare(base_path, other_path):
    base, other = per_kernel(*summarize(base_path)), per_kernel(*summarize(other_path))
    unit = next(n for n in base if "flash_bprop" in n)
    nb, no = len(base[unit]), len(other.get(unit, []))
    if no == 0:
        print("no flash backward in the second trace: no unit to compare by")
        return
    tb = sum(d for v in base.values() for d, _, _ in v) / nb
    to = sum(d for v in other.values() for d, _, _ in v) / no
    slower = extra = 0.0
    rows = []
    for name in set(base) | set(other):
        b, o = base.get(name, []), other.get(name, [])
        mean_b = sum(d for d, _, _ in b) / len(b) if b else 0.0
        mean_o = sum(d for d, _, _ in o) / len(o) if o else 0.0
        if b:
            slower += len(o) / no * (mean_o - mean_b)
            extra += (len(o) / no - len(b) / nb) * mean_b
        else:
            extra += len(o) / no * mean_o
        rows.append((len(o) / no * mean_o - len(b) / nb * mean_b, mean_b, mean_o, len(b) / nb, len(o) / no, name))
    print(f"trainer-stream kernel time per unit (one flash backward): {1e3 * tb:.3f} -> {1e3 * to:.3f} ms; "
          f"same kernels slower {1e3 * slower:+.3f} ms, extra kernels {1e3 * extra:+.3f} ms")
    for grew, mb, mo, cb, co, name in sorted(rows, reverse=True)[:20]:
        print(f"  {1e3 * grew:+.3f} ms/unit  mean {1e3 * mb:.3f} -> {1e3 * mo:.3f} ms  calls/unit {cb:.1f} -> "
              f"{co:.1f}  {short(name)}")
    beside = collections.defaultdict(lambda: [0.0, 0.0])
    for name, o in other.items():
        if name not in base:
            continue
        mean_b = sum(d for d, _, _ in base[name]) / len(base[name])
        for d, with_add, with_fetch in o:
            key = ("an addition" if with_add > 0.5 else "a fetch" if with_fetch > 0.5
                   else "neither" if with_add == 0 and with_fetch == 0 else "partly")
            beside[key][0] += (d - mean_b) / no
            beside[key][1] += d / no
    print("  slowdown by what ran beside (ms/unit slower, of ms/unit):",
          {k: (round(1e3 * v[0], 3), round(1e3 * v[1], 3)) for k, v in beside.items()})


if __name__ == "__main__":
    if len(sys.argv) == 2:
        summarize(sys.argv[1])
    elif len(sys.argv) == 3:
        compare(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
