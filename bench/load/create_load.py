#!/usr/bin/env python3
"""Concurrent CreateJobs that scan large datasets, against a running `oombd serve`, while
health checks and reads go on (issue 36, item 7). Through the Python SDK (client/python), with
retries off so that every failure is counted.

CREATES CreateJob calls run at once, each naming its own text dataset of MB megabytes (JSONL
"text" lines, tokenized by the real SmolLM2 tokenizer during CreateJob: the daemon scans
datasets of up to 16 MiB inline). Meanwhile, until every CreateJob has answered:
  - a health prober calls grpc.health.v1 Check every 200 ms with a 1 s deadline (on the main
    port, and on the plaintext health port when --health-endpoint is given);
  - a reader calls GetJob and ListJobs back to back.
Prints a table (and --json) of the latencies; exits 1 when a health check failed or a read
failed, or, with --max-read-p99-ms, when the reads' p99 exceeded it. 77: grpcio or the SDK missing.
"""
import argparse
import json
import os
import random
import sys
import threading
import time

try:
    import grpc
    import oomb
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"create_load: skipped: {e}")
    sys.exit(77)


def write_dataset(path, megabytes, texts, seed):
    rng = random.Random(seed)
    words = texts.split()
    with open(path, "w") as f:
        size = 0
        while size < megabytes * 1_000_000:
            start = rng.randrange(0, max(1, len(words) - 800))
            line = json.dumps({"text": " ".join(words[start:start + 700])}) + "\n"
            f.write(line)
            size += len(line)


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--health-endpoint", default="")
    p.add_argument("--model", required=True, help="a model directory with tokenizer.json (SmolLM2)")
    p.add_argument("--texts", required=True, help="a long text file to cut the datasets from")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--creates", type=int, default=8)
    p.add_argument("--mb", type=float, default=15)
    p.add_argument("--max-read-p99-ms", type=float, default=0)
    p.add_argument("--json", default="")
    a = p.parse_args()

    with open(a.texts, encoding="utf-8", errors="replace") as f:
        texts = f.read()
    os.makedirs(a.work_dir, exist_ok=True)
    datasets = []
    for i in range(a.creates):
        path = os.path.join(a.work_dir, f"data{i}.jsonl")
        write_dataset(path, a.mb, texts, i)
        datasets.append(path)

    client = oomb.Client(endpoint=a.endpoint, retry=oomb.RetryPolicy.none())
    probes = [("main", client)]
    if a.health_endpoint:
        probes.append(("health port", oomb.Client(endpoint=a.health_endpoint, retry=oomb.RetryPolicy.none())))

    done = threading.Event()
    results = {"create_s": [], "create_errors": [], "health_ms": {n: [] for n, _ in probes},
               "health_failures": {n: 0 for n, _ in probes}, "get_ms": [], "list_ms": [], "read_errors": []}
    lock = threading.Lock()

    def create(i):
        spec = {"display_name": f"load-{i}", "model": {"path": a.model},
                "data": {"train": datasets[i], "max_seq_len": 2048}}
        start = time.monotonic()
        try:
            client.jobs.create(spec, job_id=f"load-{i}", timeout=900)
            with lock:
                results["create_s"].append(time.monotonic() - start)
        except oomb.OombError as e:
            with lock:
                results["create_errors"].append(f"{e.code.name}: {e.message[:200]}")

    def prober(name, probe):
        while not done.is_set():
            start = time.monotonic()
            try:
                probe.health(timeout=1.0)
                with lock:
                    results["health_ms"][name].append(1000 * (time.monotonic() - start))
            except oomb.OombError:
                with lock:
                    results["health_failures"][name] += 1
            done.wait(0.2)

    def first_page():
        next(client.jobs.list(page_size=50), None)  # one ListJobs call

    def reader():
        while not done.is_set():
            for key, call in (("get_ms", lambda: client.jobs.get("load-0", timeout=10)), ("list_ms", first_page)):
                start = time.monotonic()
                try:
                    call()
                    with lock:
                        results[key].append(1000 * (time.monotonic() - start))
                except oomb.OombError as e:
                    if e.code != grpc.StatusCode.NOT_FOUND:  # load-0 may not exist yet
                        with lock:
                            results["read_errors"].append(f"{e.code.name}: {e.message[:200]}")

    background = [threading.Thread(target=prober, args=pr) for pr in probes] + [threading.Thread(target=reader)]
    for t in background:
        t.start()
    creators = [threading.Thread(target=create, args=(i,)) for i in range(a.creates)]
    started = time.monotonic()
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    wall = time.monotonic() - started
    done.set()
    for t in background:
        t.join()

    reads = results["get_ms"] + results["list_ms"]
    summary = {
        "creates": a.creates, "mb_each": a.mb, "wall_s": round(wall, 2),
        "create_s_max": round(max(results["create_s"], default=float("nan")), 2),
        "create_errors": results["create_errors"],
        "health": {n: {"checks": len(v), "failures": results["health_failures"][n],
                       "p50_ms": round(percentile(v, 0.5), 2), "p99_ms": round(percentile(v, 0.99), 2),
                       "max_ms": round(max(v, default=float("nan")), 2)} for n, v in results["health_ms"].items()},
        "reads": {"count": len(reads), "errors": results["read_errors"][:5],
                  "get_p99_ms": round(percentile(results["get_ms"], 0.99), 2),
                  "list_p99_ms": round(percentile(results["list_ms"], 0.99), 2),
                  "p50_ms": round(percentile(reads, 0.5), 2), "p99_ms": round(percentile(reads, 0.99), 2),
                  "max_ms": round(max(reads, default=float("nan")), 2)},
    }
    print(f"| {a.creates} CreateJobs of {a.mb:g} MB each | all answered after {wall:.1f} s |")
    print("| probe | count | failures | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|")
    for n, h in summary["health"].items():
        print(f"| health ({n}, 1 s deadline) | {h['checks']} | {h['failures']} | {h['p50_ms']} | {h['p99_ms']} | {h['max_ms']} |")
    r = summary["reads"]
    print(f"| GetJob + ListJobs | {r['count']} | {len(results['read_errors'])} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    failed = []
    if results["create_errors"]:
        failed.append(f"CreateJob errors: {results['create_errors'][:3]}")
    if any(results["health_failures"].values()):
        failed.append(f"health checks failed: {results['health_failures']}")
    if results["read_errors"]:
        failed.append(f"reads failed: {results['read_errors'][:3]}")
    if a.max_read_p99_ms > 0 and r["p99_ms"] > a.max_read_p99_ms:
        failed.append(f"read p99 {r['p99_ms']} ms > {a.max_read_p99_ms} ms")
    if failed:
        print("create_load: FAILED: " + "; ".join(failed), file=sys.stderr)
        sys.exit(1)
    print("create_load: ok")


if __name__ == "__main__":
    main()
