#!/usr/bin/env python3
"""A job's life through a Python gRPC client, and the adapter it produces in PEFT.

Driven by tests/client/lifecycle_integration_test.cc (Lifecycle.PythonGrpcClientAndPeftParity)
against a running `oombd serve`:

  1. connects with the Python SDK (client/python, package `oomb`, installed in the venv by
     scripts/setup.sh; its modules were generated from proto/ when it was built);
  2. CreateJob (a LoRA job on SmolLM2, float32, 2 steps of 256 tokens) with a request_id, twice
     (the same job), WatchJob as a raw stream until SUCCEEDED (snapshot first, then events with
     increasing sequence), the SDK's events (ListJobEvents, and WatchJob: the same events), and a
     second WatchJob resumed with after_sequence (only the rest);
  3. loads the final checkpoint with PeftModel.from_pretrained and compares PEFT's mean loss
     on a fixed token sequence with `oombd model eval --adapter DIR` (float32, |diff| <= 1e-4),
     and the base model's likewise; the adapter must move the loss by more than that.

Exit status: 0 ok, 1 a check failed, 77 a Python dependency is missing (the test skips).
"""
import argparse
import json
import math
import os
import subprocess
import sys

try:
    import grpc
    import oomb
    import torch
    from oomb.v1 import jobs_pb2
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"grpc_lifecycle: skipped: {e}")
    sys.exit(77)

TOLERANCE = 1e-4


def check(cond, msg):
    if not cond:
        print(f"grpc_lifecycle: FAILED: {msg}", file=sys.stderr)
        sys.exit(1)


def austen_text(model_dir, words):
    texts = os.path.join(os.path.dirname(os.path.dirname(model_dir)), "texts", "austen")
    with open(os.path.join(texts, "emma.txt"), encoding="utf-8") as f:
        return " ".join(f.read().split()[:words])


def oombd_eval(oombd, model, data, adapter=None):
    cmd = [oombd, "model", "eval", "--model", model, "--data", data, "--dtype", "float32", "--device", "cpu",
           "--chunk-tokens", "32"]
    if adapter:
        cmd += ["--adapter", adapter]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--oombd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

    client = oomb.Client(endpoint=a.endpoint, timeout=60)
    grpc.channel_ready_future(client.channel).result(timeout=30)
    stub = client.stub  # the generated JobServiceStub, for the stream's wire-level checks

    train = os.path.join(a.workdir, "py_train.jsonl")
    with open(train, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": austen_text(a.model, 250)}) + "\n")
    spec = {
        "display_name": "python-client",
        "labels": {"client": "python"},
        "model": {"path": a.model, "dtype": "float32"},
        "method": {"type": "lora", "lora": {"rank": 8, "alpha": 16, "target_modules": [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}},
        "data": {"train": train, "max_seq_len": 256},
        "training": {"max_steps": 2, "learning_rate": 5e-3, "lr_schedule": "constant", "warmup_steps": 0},
        "memory": {"chunk_tokens": 128},
        "checkpoint": {"every_steps": 1},
        "resources": {"device": "cpu"},
    }
    job = client.jobs.create(spec, job_id="py-job", request_id="py-req-1")
    check(job.id == "py-job", f"CreateJob returned {job.name}")
    again = client.jobs.create(spec, job_id="py-job", request_id="py-req-1")  # the same job, not a new one
    check(again.name == job.name, "a retried CreateJob with the same request_id made another job")

    # Watch until the job ends: a snapshot, then events with increasing sequence.
    responses = list(stub.WatchJob(jobs_pb2.WatchJobRequest(name=job.name), timeout=300))
    check(responses and responses[0].HasField("snapshot"), "WatchJob did not start with a snapshot")
    watched = [r.event for r in responses[1:]]
    check(all(r.HasField("event") for r in responses[1:]), "WatchJob sent a second snapshot")
    seqs = [e.sequence for e in watched]
    check(seqs == list(range(1, len(seqs) + 1)), f"watched sequences are not 1..n: {seqs}")
    states = [jobs_pb2.Job.State.Name(e.state) for e in watched if e.type == jobs_pb2.JobEvent.STATE_CHANGED]
    check(states == ["QUEUED", "RUNNING", "SUCCEEDED"], f"states {states}")
    steps = [e.progress.step for e in watched if e.type == jobs_pb2.JobEvent.STEP]
    check(steps == [1, 2], f"STEP events {steps}")
    check(all(math.isfinite(e.progress.loss) and e.progress.loss > 0 for e in watched
              if e.type == jobs_pb2.JobEvent.STEP), "a step loss is not a positive number")

    listed = list(job.events(follow=False))
    check(listed == watched, "ListJobEvents differs from the watched events")
    followed = list(job.events(follow=True))
    check(followed == watched, "the SDK's WatchJob events differ from the raw stream's")
    check(job.state == oomb.JobState.SUCCEEDED, f"the watch's snapshot left the job {job.state}")

    # A watch resumed after a sequence replays only what follows it.
    k = len(watched) // 2
    rest = list(stub.WatchJob(jobs_pb2.WatchJobRequest(name=job.name, after_sequence=k), timeout=60))
    check(rest[0].HasField("snapshot") and rest[0].snapshot.state == jobs_pb2.Job.SUCCEEDED,
          "the resumed watch's snapshot is not the SUCCEEDED job")
    check([r.event for r in rest[1:]] == watched[k:], "the resumed watch did not replay exactly the rest")
    check(list(job.events(after=k)) == watched[k:], "the SDK's events after a sequence are not exactly the rest")

    got = client.jobs.get(job.name)
    check(got.state == oomb.JobState.SUCCEEDED and got.progress.step == 2, f"GetJob: {got.state} {got.progress}")
    try:
        client.jobs.get("no-such-job")
        check(False, "GetJob of a missing job succeeded")
    except oomb.NotFound as e:
        check(e.code == grpc.StatusCode.NOT_FOUND, f"GetJob of a missing job: {e.code}")

    cps = job.checkpoints()
    final = [c for c in cps if c.final]
    check(len(final) == 1 and final[0].step == 2, f"checkpoints {cps}")
    adapter = final[0].path
    print(f"grpc_lifecycle: {job.name} SUCCEEDED, {len(watched)} events, adapter {adapter}")

    # The adapter in PEFT against oomb's own evaluation, on a fixed token sequence.
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    ids = tokenizer(austen_text(a.model, 400))["input_ids"][200:296]
    check(len(ids) == 96, f"got {len(ids)} tokens")
    data = os.path.join(a.workdir, "py_eval.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        f.write(json.dumps({"input_ids": ids}) + "\n")
    base = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, adapter).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        peft_loss = model(input_ids=x, labels=x).loss.item()
        with model.disable_adapter():
            base_loss = model(input_ids=x, labels=x).loss.item()
    oomb_adapter = oombd_eval(a.oombd, a.model, data, adapter)
    oomb_base = oombd_eval(a.oombd, a.model, data)
    print(f"grpc_lifecycle: loss with adapter: peft {peft_loss:.6f} oomb {oomb_adapter['loss']:.6f}; "
          f"base: hf {base_loss:.6f} oomb {oomb_base['loss']:.6f}")
    check(oomb_adapter["tokens"] == len(ids) - 1, f"oomb scored {oomb_adapter['tokens']} tokens")
    check(abs(peft_loss - oomb_adapter["loss"]) <= TOLERANCE, "PEFT and oomb disagree on the adapted model")
    check(abs(base_loss - oomb_base["loss"]) <= TOLERANCE, "transformers and oomb disagree on the base model")
    check(abs(peft_loss - base_loss) > 10 * TOLERANCE, "the adapter does not change the loss: nothing was trained")
    print("grpc_lifecycle: ok")


if __name__ == "__main__":
    main()
