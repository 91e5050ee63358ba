#!/usr/bin/env python3
"""Time and cost before submitting (issue 54, item 4) against a real daemon on the CPU, through
the SDK: EstimateJob's step time and device-hours for the real SmolLM2-135M beside its memory
plan, checked against the steps the same daemon then measures.

Run by ctest as `estimate_time` (tests/CMakeLists.txt): test_estimate.py OOMBD OOMB. Checks:

  1. the first estimate of a shape measures the rates (worker/job/calibration.h; asked again while
     the daemon answers "measuring") and keeps them in <data_dir>/engine_rates.json; step_seconds > 0,
     total_steps = training.max_steps,
     device_hours = steps x step_seconds / 3600, `rates` names the device and the time; the CLI
     prints the same;
  2. the next estimate of the same shape, after a daemon restart too, reuses them (the same
     measurement time); another chunk size is another entry; a tensor-parallel job
     (`parallel.tensor`) measures one rank's shard, another entry, and says so in `rates`;
  3. what is not estimated says why, with the plan still given: sparse attention, and the
     device-hours of a job that trains for epochs; a daemon whose rates file is not JSON
     measures again;
  4. the job then runs its steps on the same daemon: the predicted step is within a factor of
     2 of the measured one (the steps and the measurement share this machine's cores with
     whatever else runs, so the bound is loose; bench/results holds the GPU comparison).

Prints "estimate_time: ok" at the end. Exit status: 0 ok, 1 a check failed, 77 skipped (no test
data, no SDK).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sdk import DATA, Daemon, Failure, check  # noqa: E402

try:
    import oomb
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"estimate_time: skipped: {e} (scripts/setup.sh installs the SDK)")
    sys.exit(77)

MODEL = os.path.join(DATA, "models", "SmolLM2-135M-Instruct")
TEXT = os.path.join(DATA, "texts", "austen", "emma.txt")
STEPS = 2


def spec(train, **memory):
    return {
        "display_name": "estimate",
        "model": {"path": MODEL, "dtype": "float32"},
        "method": {"type": "lora", "lora": {"rank": 8, "alpha": 16}},
        "data": {"train": train, "max_seq_len": 512},
        "training": {"max_steps": STEPS, "warmup_steps": 0},
        "memory": {"chunk_tokens": 128, **memory},
        "checkpoint": {"every_steps": 0},
        "resources": {"device": "cpu"},
    }


def estimate(client, job_spec):
    """EstimateJob, asked again while the daemon is still measuring the shape's rates."""
    deadline = time.monotonic() + 600
    while True:
        r = client.jobs.estimate(job_spec)
        if not r.rates.startswith("not estimated: measuring") or time.monotonic() > deadline:
            return r
        time.sleep(1)


def kept(data_dir):
    with open(os.path.join(data_dir, "engine_rates.json")) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("oombd")
    p.add_argument("oomb")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(MODEL, "config.json")) or not os.path.isfile(TEXT):
        print(f"estimate_time: skipped: no {MODEL} or {TEXT} (scripts/fetch_test_data.sh)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="oomb_estimate_test_")
    data_dir = os.path.join(tmp, "data")
    # Three CPU devices: check 2 estimates a job of 3 tensor-parallel CPU ranks.
    daemon = Daemon(a.oombd, data_dir, extra=["--set", "scheduler.devices=cpu,cpu,cpu"])
    try:
        train = os.path.join(tmp, "train.jsonl")
        subprocess.run([a.oombd, "data", "build", "--model", MODEL, "--tokens", "512", "--max-samples", "4", TEXT,
                        "-o", train], check=True, stdout=subprocess.DEVNULL)
        daemon.start()
        client = oomb.Client(endpoint=daemon.endpoint)

        # 1. The first estimate measures and keeps the rates.
        first = estimate(client, spec(train))
        check(first.fits and first.step_seconds > 0, f"a step time beside the plan: {first}")
        check(first.total_steps == STEPS, f"total_steps {first.total_steps}")
        check(abs(first.device_hours - STEPS * first.step_seconds / 3600) < 1e-9, f"device_hours {first.device_hours}")
        check(first.rates.startswith("measured on cpu") and "chunks of 128" in first.rates, first.rates)
        entries = kept(data_dir)
        check(len(entries) == 1, f"one kept entry: {list(entries)}")
        (entry,) = entries.values()
        check(entry["layer_train_s"] >= entry["layer_forward_s"] > 0 and entry["head_train_s"] > 0 and
              entry["past_backward_s_per_pair"] > 0 and entry["past_forward_s_per_pair"] > 0, f"rates: {entry}")
        spec_file = os.path.join(tmp, "job.json")
        with open(spec_file, "w") as f:
            json.dump(spec(train), f)
        cli = subprocess.run([a.oomb, "--endpoint", daemon.endpoint, "estimate", spec_file], check=True,
                             capture_output=True, text=True).stdout
        check(f"rates               {first.rates}" in cli and "step time" in cli and "device-hours" in cli, cli)
        print(f"estimate_time: first estimate {first.step_seconds:.2f} s a step ({first.rates})", flush=True)

        # 2. Kept: the same shape again, after a restart; another chunk size is another entry.
        check(client.jobs.estimate(spec(train)).rates == first.rates, "the kept rates reused")
        daemon.stop()
        daemon.start()
        client = oomb.Client(endpoint=daemon.endpoint)
        check(client.jobs.estimate(spec(train)).rates == first.rates, "the kept rates reused after a restart")
        other = estimate(client, spec(train, chunk_tokens=256))
        check(other.step_seconds > 0 and "chunks of 256" in other.rates and len(kept(data_dir)) == 2, other.rates)
        # Tensor parallelism over 3 CPU ranks: one rank's shard (3 of the 9 heads, 1 of the 3 KV
        # heads) measured and timed, another entry.
        tp = estimate(client, {**spec(train), "resources": {"device": "cpu", "gpus": 3}, "parallel": {"tensor": 3}})
        check(tp.fits and tp.step_seconds > 0 and "one rank's shard of 3 (parallel.tensor)" in tp.rates, tp.rates)
        check(any(" a3/1x64" in key for key in kept(data_dir)) and len(kept(data_dir)) == 3, list(kept(data_dir)))
        print(f"estimate_time: tensor-parallel estimate {tp.step_seconds:.2f} s a step ({tp.rates})", flush=True)

        # 3. Not estimated, and why; an unreadable file is measured again.
        sparse_attention = {"mode": "sparse", "sparse": {"page_budget": 2, "sink_pages": 1, "local_pages": 1}}
        sparse = client.jobs.estimate({**spec(train, page_tokens=128), "attention": sparse_attention})
        check(sparse.fits and sparse.step_seconds == 0 and sparse.rates.startswith("not estimated: sparse"),
              f"sparse: {sparse.rates}")
        by_epochs = spec(train)
        by_epochs["training"] = {"epochs": 1}
        epochs = client.jobs.estimate(by_epochs)
        check(epochs.step_seconds > 0 and epochs.total_steps == 0 and epochs.device_hours == 0 and
              "training.epochs" in epochs.rates, f"epochs: {epochs}")
        daemon.stop()
        with open(os.path.join(data_dir, "engine_rates.json"), "w") as f:
            f.write("not json")
        daemon.start()
        client = oomb.Client(endpoint=daemon.endpoint)
        again = estimate(client, spec(train))
        check(again.step_seconds > 0 and again.rates != first.rates and len(kept(data_dir)) == 1, again.rates)
        check("measuring again" in daemon.tail(200), "the unreadable file is logged")

        # 4. The steps the job then takes.
        job = client.jobs.create(spec(train)).wait(timeout=600)
        measured = job.progress.step_seconds
        ratio = again.step_seconds / measured
        print(f"estimate_time: predicted {again.step_seconds:.2f} s, measured {measured:.2f} s (step {STEPS}): "
              f"ratio {ratio:.2f}", flush=True)
        check(0.5 <= ratio <= 2.0, f"predicted / measured {ratio:.2f}, outside [0.5, 2]")
    except Failure as e:
        print(f"estimate_time: FAILED: {e}", file=sys.stderr)
        print(f"--- {daemon.log}:\n{daemon.tail()}", file=sys.stderr)
        sys.exit(1)
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("estimate_time: ok")


if __name__ == "__main__":
    main()
