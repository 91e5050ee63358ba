#!/usr/bin/env python3
"""Issue 54's transfer target: uploads and downloads over loopback, their rate and the daemon's
memory while they run.

    transfer_bench.py OOMBD OOMB OUT_DIR [--dataset-gib 2] [--model DIR] [--make-model-layers N]

Starts `oombd serve` on loopback (port 0, its own data dir), then:
  1. writes a pre-tokenized JSONL dataset of --dataset-gib GiB and uploads it three ways: the CLI
     (`oomb datasets upload`), the SDK (`client.datasets.upload`), HTTP (`curl -T`); each upload
     is timed whole (the server checks every line before it answers) and the rate reported is
     bytes / seconds;
  2. trains a model with full fine-tuning for one step (--device, default the CPU; a checkpoint
     of its weights and AdamW moments in float32: 1.6 GB for the default SmolLM2-135M; --model names another,
     --make-model-layers N makes a random Llama-shaped one of N layers of width 1024 with
     transformers, 12 bytes a parameter: 3.2 GB for N = 12, for a machine without SmolLM2), and
     downloads the final checkpoint with the CLI (`oomb download`), the SDK (`job.download`) and
     HTTP (`curl`), each timed whole;
  3. samples the daemon's resident memory (VmRSS, every 10 ms) during each transfer: its growth
     over the value when the transfer began is what the transfer held (the daemon's peak before
     and after, VmHWM, also includes the training step); and the CPU seconds of the daemon's
     busiest threads during it (`daemon_threads_cpu_s`, by thread name), where its time went.
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
import threading
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


class RssSampler:
    """The largest VmRSS of `pid` while the `with` block runs, less its value at the start."""

    def __init__(self, pid):
        self.pid, self.peak, self.start = pid, 0, 0
        self._stop = threading.Event()

    def _run(self):
        n = 0
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid)["VmRSS"])
            if n % 10 == 0:  # every 100 ms: a thread that ends keeps its last reading
                self.last.update(self.threads())
            n += 1
            time.sleep(0.01)

    def threads(self):
        """CPU seconds (user + system) of each of the daemon's threads, by id: (name, seconds)."""
        out = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        return out

    def __enter__(self):
        self.start = self.peak = rss(self.pid)["VmRSS"]
        self.first, self.last = self.threads(), {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.last.update(self.threads())

    @property
    def busiest(self):
        """The 6 threads of the most CPU seconds during the block: [[name, seconds], ...]."""
        used = [(name, seconds - self.first.get(tid, (name, 0.0))[1]) for tid, (name, seconds) in self.last.items()]
        return [[name, round(seconds, 2)] for name, seconds in sorted(used, key=lambda u: -u[1])[:6] if seconds > 0]

    @property
    def growth(self):
        return self.peak - self.start


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


def make_model(path, layers):
    """A Llama-shaped model of random weights (float32), width 1024, `layers` layers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("oombd")
    p.add_argument("oomb")
    p.add_argument("out")
    p.add_argument("--dataset-gib", type=float, default=2.0)
    p.add_argument("--model", default=SMOL)
    p.add_argument("--make-model-layers", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the one training step runs (cpu, cuda)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="oomb_transfer_")
    results = []
    daemon = Daemon(a.oombd, os.path.join(tmp, "data")).start()
    pid = daemon.proc.pid
    try:
        env = dict(os.environ, OOMB_ENDPOINT=daemon.endpoint)
        # curl with the system's libraries (scripts/gpu_run.sh puts the carried ones first).
        curl_env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        http = "http://127.0.0.1:" + open(os.path.join(daemon.dir, "oombd.http.port")).read().strip()
        before = rss(pid)

        def record(what, nbytes, seconds, sampler):
            r = {"what": what, "bytes": nbytes, "seconds": round(seconds, 3),
                 "MB_per_s": round(nbytes / seconds / 1e6, 1), "daemon_rss_growth_bytes": sampler.growth,
                 "daemon_threads_cpu_s": sampler.busiest,
                 "daemon": rss(pid)}
            results.append(r)
            print(json.dumps(r), flush=True)

        data = os.path.join(tmp, "ids.jsonl")
        size = write_dataset(data, a.dataset_gib)
        client = oomb.Client(endpoint=daemon.endpoint)
        for what, fn in (
                ("upload: oomb datasets upload", lambda: subprocess.run(
                    [a.oomb, "datasets", "upload", data, "--id", "cli"], env=env, check=True,
                    stdout=subprocess.DEVNULL)),
                ("upload: SDK datasets.upload", lambda: client.datasets.upload(data, dataset_id="sdk")),
                ("upload: curl -T (HTTP PUT)", lambda: subprocess.run(
                    ["curl", "-sS", "--fail-with-body", "-T", data, f"{http}/v1/projects/default/datasets/curl"],
                    check=True, stdout=subprocess.DEVNULL, env=curl_env))):
            if "curl" in what and not shutil.which("curl"):
                print(f"{what}: skipped, no curl on this machine", flush=True)
                continue
            with RssSampler(pid) as sampler:
                t = time.monotonic()
                fn()
                seconds = time.monotonic() - t
            record(what, size, seconds, sampler)

        train = os.path.join(tmp, "small.jsonl")
        with open(train, "w") as f:
            f.write(json.dumps({"input_ids": list(range(3, 259))}) + "\n")
        model = make_model(os.path.join(tmp, "model"), a.make_model_layers) if a.make_model_layers else a.model
        spec = {"model": {"path": model, "dtype": "float32"}, "method": {"type": "full"},
                "data": {"train": train, "max_seq_len": 256}, "training": {"max_steps": 1},
                "memory": {"chunk_tokens": 256}, "resources": {"device": a.device}}
        job = client.jobs.create(spec, job_id="full").wait(timeout=1800)
        final = os.path.join(job.checkpoint_dir, "final")
        ckpt_bytes = sum(os.path.getsize(os.path.join(final, n)) for n in os.listdir(final))
        for what, fn in (
                ("download: oomb download", lambda d: subprocess.run(
                    [a.oomb, "download", "full", "--dir", d], env=env, check=True, stdout=subprocess.DEVNULL)),
                ("download: SDK job.download", lambda d: job.download(d)),
                ("download: curl (HTTP GET, the tar)", lambda d: subprocess.run(
                    ["curl", "-sS", "--fail-with-body", "-o", os.path.join(tmp, "c.tar"),
                     f"{http}/v1/projects/default/jobs/full/checkpoints/final:download"], check=True, env=curl_env))):
            if "curl" in what and not shutil.which("curl"):
                print(f"{what}: skipped, no curl on this machine", flush=True)
                continue
            d = os.path.join(tmp, what.split(":")[1].strip().split()[0])
            with RssSampler(pid) as sampler:
                t = time.monotonic()
                fn(d)
                seconds = time.monotonic() - t
            record(what, ckpt_bytes, seconds, sampler)
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
