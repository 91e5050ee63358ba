#!/usr/bin/env python3
"""Issue 54's transfer target: uploads and downloads over loopback, their rate and the daemon's
memory while they run.

    transfer_bench.py OOMBD OOMB OUT_DIR [--dataset-gib 2]

Starts `oombd serve` on loopback (port 0, its own data dir), then:
  1. writes a pre-tokenized JSONL dataset of --dataset-gib GiB and uploads it three ways: the CLI
     (`oomb datasets upload`), the SDK (`client.datasets.upload`), HTTP (`curl -T`); each upload
     is timed whole (the server checks every line before it answers) and the rate reported is
     bytes / seconds;
  2. trains SmolLM2-135M with full fine-tuning for one step on the CPU (a checkpoint of its
     weights and AdamW moments in float32: about 1.6 GB), and downloads the final checkpoint with
     the CLI (`oomb download`), the SDK (`job.download`) and HTTP (`curl`), each timed whole;
  3. reads the daemon's peak resident memory (VmHWM) before and after, and its current RSS.
Writes OUT_DIR/transfer.jsonl (one JSON line per transfer) and prints a summary.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
from test_sdk import Daemon  # noqa: E402

import oomb  # noqa: E402

DATA = os.environ.get("OOMB_DATA_DIR") or os.path.expanduser("~/.cache/oomb/data")
SMOL = os.path.join(DATA, "models", "SmolLM2-135M-Instruct")


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def write_dataset(path, gib):
    rng = random.Random(1)
    line = json.dumps({"input_ids": [rng.randrange(3, 49000) for _ in range(2048)]}) + "\n"
    target = int(gib * (1 << 30))
    with open(path, "w") as f:
        written = 0
        while written < target:
            f.write(line)
            written += len(line)
    return os.path.getsize(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("oombd")
    p.add_argument("oomb")
    p.add_argument("out")
    p.add_argument("--dataset-gib", type=float, default=2.0)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="oomb_transfer_")
    results = []
    daemon = Daemon(a.oombd, os.path.join(tmp, "data")).start()
    pid = daemon.proc.pid
    try:
        env = dict(os.environ, OOMB_ENDPOINT=daemon.endpoint)
        http = "http://127.0.0.1:" + open(os.path.join(daemon.dir, "oombd.http.port")).read().strip()
        before = rss(pid)

        def record(what, nbytes, seconds):
            r = {"what": what, "bytes": nbytes, "seconds": round(seconds, 3),
                 "MB_per_s": round(nbytes / seconds / 1e6, 1), "daemon": rss(pid)}
            results.append(r)
            print(json.dumps(r), flush=True)

        data = os.path.join(tmp, "ids.jsonl")
        size = write_dataset(data, a.dataset_gib)
        t = time.monotonic()
        subprocess.run([a.oomb, "datasets", "upload", data, "--id", "cli"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        record("upload: oomb datasets upload", size, time.monotonic() - t)
        client = oomb.Client(endpoint=daemon.endpoint)
        t = time.monotonic()
        client.datasets.upload(data, dataset_id="sdk")
        record("upload: SDK datasets.upload", size, time.monotonic() - t)
        t = time.monotonic()
        subprocess.run(["curl", "-sS", "--fail-with-body", "-T", data, f"{http}/v1/projects/default/datasets/curl"],
                       check=True, stdout=subprocess.DEVNULL)
        record("upload: curl -T (HTTP PUT)", size, time.monotonic() - t)

        train = os.path.join(tmp, "small.jsonl")
        with open(train, "w") as f:
            f.write(json.dumps({"input_ids": list(range(3, 259))}) + "\n")
        spec = {"model": {"path": SMOL, "dtype": "float32"}, "method": {"type": "full"},
                "data": {"train": train, "max_seq_len": 256}, "training": {"max_steps": 1},
                "memory": {"chunk_tokens": 256}, "resources": {"device": "cpu"}}
        job = client.jobs.create(spec, job_id="full").wait(timeout=1800)
        final = os.path.join(job.checkpoint_dir, "final")
        ckpt_bytes = sum(os.path.getsize(os.path.join(final, n)) for n in os.listdir(final))
        for what, fn in (
                ("download: oomb download", lambda d: subprocess.run(
                    [a.oomb, "download", "full", "--dir", d], env=env, check=True, stdout=subprocess.DEVNULL)),
                ("download: SDK job.download", lambda d: job.download(d)),
                ("download: curl (HTTP GET, the tar)", lambda d: subprocess.run(
                    ["curl", "-sS", "--fail-with-body", "-o", os.path.join(tmp, "c.tar"),
                     f"{http}/v1/projects/default/jobs/full/checkpoints/final:download"], check=True))):
            d = os.path.join(tmp, what.split(":")[1].strip().split()[0])
            t = time.monotonic()
            fn(d)
            record(what, ckpt_bytes, time.monotonic() - t)
            shutil.rmtree(d, ignore_errors=True)
        client.close()
        summary = {"dataset_bytes": size, "checkpoint_bytes": ckpt_bytes, "daemon_before": before,
                   "daemon_after": rss(pid), "cpus": os.cpu_count()}
        print(json.dumps(summary))
        with open(os.path.join(a.out, "transfer.jsonl"), "w") as f:
            for r in results + [summary]:
                f.write(json.dumps(r) + "\n")
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
