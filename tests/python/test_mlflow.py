#!/usr/bin/env python3
"""MLflow tracking end to end (issue 55, item 2): the real daemon and trainer, and MLflow's own
tracking server from PyPI (scripts/setup.sh installs it in ~/.cache/oomb/mlflow-venv).

Run by ctest as `mlflow_tracking` (tests/CMakeLists.txt): test_mlflow.py OOMBD.

  1. the daemon's default tracking.mlflow_uri names a server that is not running yet: a job
     whose spec names its experiment and run name runs to SUCCEEDED all the same;
  2. MLflow's server starts: the run appears by itself, FINISHED, named as the spec says, its
     loss history equal to metrics.jsonl step by step, the other per-step metrics present, the
     resolved spec as params (defaults filled in), the tags (job, project, version, the final
     checkpoint's directory), and Job.mlflow_run pointing at it;
  3. a second job, the server up, with the experiment left to its default ("oomb/default") and
     an evaluation section (the positions suite on data.validation): its eval_loss and
     eval.positions.loss.0-1024 equal to metrics.jsonl's.

Prints "mlflow_tracking: ok" at the end. Exit status: 0 ok, 1 a check failed, 77 skipped (no
test data, the SDK or MLflow not installed).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

MLFLOW = os.path.join(os.environ.get("OOMB_MLFLOW_VENV") or os.path.expanduser("~/.cache/oomb/mlflow-venv"),
                      "bin", "mlflow")

try:
    import oomb
    from test_sdk import TINY, Daemon, Failure, check, tiny_dict, write_ids
    from test_webhooks import free_port
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"mlflow_tracking: skipped: {e} (scripts/setup.sh installs the SDK)")
    sys.exit(77)


class Mlflow:
    """`mlflow server` on loopback with a SQLite backend, and its REST API."""

    def __init__(self, port, root):
        self.port, self.root, self.proc = port, root, None

    def start(self):
        os.makedirs(self.root, exist_ok=True)
        log = open(os.path.join(self.root, "mlflow.log"), "ab")
        self.proc = subprocess.Popen(
            [MLFLOW, "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
             "--default-artifact-root", f"{self.root}/artifacts"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            check(self.proc.poll() is None, f"mlflow server exited:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        raise Failure(f"mlflow server did not answer within 120 s:\n{self.tail()}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def tail(self):
        try:
            with open(os.path.join(self.root, "mlflow.log"), errors="replace") as f:
                return "".join(f.readlines()[-30:])
        except OSError:
            return "(no log)"

    def get(self, path, **query):
        url = f"http://127.0.0.1:{self.port}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/2.0/mlflow/{path}",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def finished_run(self, experiment, timeout=60):
        """The experiment's one run, once FINISHED."""
        deadline = time.monotonic() + timeout
        runs = []
        while time.monotonic() < deadline:
            try:
                exp = self.get("experiments/get-by-name", experiment_name=experiment)["experiment"]
                runs = self.post("runs/search", {"experiment_ids": [exp["experiment_id"]]}).get("runs", [])
                if runs and runs[0]["info"]["status"] == "FINISHED":
                    check(len(runs) == 1, f"{len(runs)} runs in {experiment}")
                    return runs[0]
            except OSError:
                pass  # the experiment is not there yet (404) or the server is busy
            time.sleep(0.5)
        raise Failure(f"no FINISHED run in {experiment} within {timeout} s: {runs}")


def metrics_jsonl(job):
    with open(os.path.join(job.checkpoint_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_run(mlflow, run, job, steps):
    info, data = run["info"], run["data"]
    check(job.proto.mlflow_run.endswith("/runs/" + info["run_id"]), f"Job.mlflow_run {job.proto.mlflow_run}")
    tags = {t["key"]: t["value"] for t in data.get("tags", [])}
    check(tags.get("oomb.job") == job.name and tags.get("oomb.project") == "default", f"tags {tags}")
    check(tags.get("oomb.version"), f"no oomb.version tag: {tags}")
    finals = [c for c in job.checkpoints() if c.final]
    check(finals and tags.get("oomb.final_checkpoint") == finals[0].path,
          f"oomb.final_checkpoint {tags.get('oomb.final_checkpoint')} vs {finals}")
    params = {p["key"]: p["value"] for p in data.get("params", [])}
    check(params.get("training.max_steps") == str(steps),
          f"training.max_steps param: {params.get('training.max_steps')}")
    check(params.get("model.path") == TINY and params.get("memory.chunk_tokens") == "32", "model.path / chunk params")
    check(params.get("model.dtype") == "float32" and "training.adam.beta2" in params, "defaults among the params")
    history = mlflow.get("metrics/get-history", run_id=info["run_id"], metric_key="loss")["metrics"]
    got = sorted((m["step"], m["value"]) for m in history)
    want = [(int(r["step"]), r["loss"]) for r in metrics_jsonl(job) if "loss" in r]
    check([s for s, _ in got] == [s for s, _ in want] == list(range(1, steps + 1)), f"steps {got} vs {want}")
    check(all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got, want, strict=True)),
          f"loss history {got} differs from metrics.jsonl {want}")
    keys = {m["key"] for m in data.get("metrics", [])}
    for k in ("learning_rate", "tokens_per_second", "step_seconds", "peak_device_bytes", "pcie_h2d_bytes", "tokens"):
        check(k in keys, f"metric {k} missing: {sorted(keys)}")


def check_evaluation(mlflow, run, job):
    last = [r for r in metrics_jsonl(job) if "evaluation" in r][-1]
    bucket = last["evaluation"]["positions"]["buckets"][0]
    key = f"eval.positions.loss.{bucket['begin']}-{bucket['end']}"
    for name, want in ((key, bucket["loss"]), ("eval_loss", last.get("eval_loss"))):
        history = mlflow.get("metrics/get-history", run_id=run["info"]["run_id"], metric_key=name)["metrics"]
        check(history and want is not None and abs(history[-1]["value"] - want) <= 1e-6 * max(1.0, abs(want)),
              f"{name}: MLflow {history} vs metrics.jsonl {want}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("oombd")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(TINY, "config.json")):
        print(f"mlflow_tracking: skipped: no tiny test model under {TINY} (scripts/fetch_test_data.sh)")
        sys.exit(77)
    if not os.access(MLFLOW, os.X_OK):
        print(f"mlflow_tracking: skipped: no {MLFLOW} (scripts/setup.sh installs it)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="oomb_mlflow_test_")
    mlflow = Mlflow(free_port(), os.path.join(tmp, "mlflow"))
    daemon = None
    try:
        train = os.path.join(tmp, "ids.jsonl")
        write_ids(train, 8, 120)
        daemon = Daemon(a.oombd, os.path.join(tmp, "data"), [
            "--set", f"tracking.mlflow_uri=http://127.0.0.1:{mlflow.port}"]).start()
        client = oomb.Client(endpoint=daemon.endpoint)
        t = time.monotonic()
        spec = tiny_dict(train, 8, 4)
        spec["tracking"] = {"mlflow": {"experiment": "tiny-exp", "run_name": "first"}}
        job = client.jobs.create(spec, job_id="tracked").wait(timeout=300)
        check(job.state == oomb.JobState.SUCCEEDED, f"the job with MLflow away: {job.state} {job.error}")
        check(not job.proto.mlflow_run, "a run link while MLflow was away")
        print(f"mlflow_tracking: job done with the tracking server away ({time.monotonic() - t:.1f} s)", flush=True)

        t = time.monotonic()
        mlflow.start()
        print(f"mlflow_tracking: mlflow server up ({time.monotonic() - t:.1f} s)", flush=True)
        run = mlflow.finished_run("tiny-exp")
        check(run["info"]["run_name"] == "first", f"run name {run['info']['run_name']}")
        job = client.jobs.get("tracked")
        check_run(mlflow, run, job, 8)
        print("mlflow_tracking: the run logged after the server came up matches metrics.jsonl", flush=True)

        spec = tiny_dict(train, 3, 0)
        spec["data"]["validation"] = train
        spec["evaluation"] = {"suites": ["positions"]}
        second = client.jobs.create(spec, job_id="tracked-2").wait(timeout=300)
        check(second.state == oomb.JobState.SUCCEEDED, f"the evaluated job: {second.state} {second.error}")
        run = mlflow.finished_run("oomb/default")
        check(run["info"]["run_name"] == "tracked-2", f"default run name {run['info']['run_name']}")
        check_run(mlflow, run, client.jobs.get("tracked-2"), 3)
        check_evaluation(mlflow, run, client.jobs.get("tracked-2"))
        logs = [e.message for e in second.events(follow=False) if e.message.startswith("tracking: MLflow run ")]
        check(len(logs) == 1, f"the run's LOG event: {logs}")
        client.close()
    except Failure as e:
        print(f"mlflow_tracking: FAILED: {e}")
        if daemon is not None:
            print(daemon.tail(40))
        print(mlflow.tail())
        sys.exit(1)
    finally:
        mlflow.stop()
        if daemon is not None:
            daemon.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print("mlflow_tracking: ok")


if __name__ == "__main__":
    main()
