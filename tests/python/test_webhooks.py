#!/usr/bin/env python3
"""Webhooks end to end (issue 55, item 1): the real daemon, trainer and SDK, and a real HTTP
receiver that verifies every signature with the Standard Webhooks reference library
(`standardwebhooks` from PyPI).

Run by ctest as `webhooks` (tests/CMakeLists.txt): test_webhooks.py OOMBD.

  1. submit-time errors naming the field: a missing secret file, a secret that is not one, a URL
     that is not http(s), a destination the operator does not allow (issue 78: the daemon runs
     with outbound.allow naming 127.0.0.1, where the receiver listens, and no other loopback);
  2. durability: a job telling two endpoints (its own, hearing everything; its project's from
     tenancy.projects_file, hearing job_succeeded) runs while the receiver is down; the daemon is
     killed (SIGKILL) mid-run, restarted, the job recovers and succeeds, the daemon is killed again
     with every message still undelivered, restarted, and only then the receiver comes up (its
     first answer a 500): every checkpoint.saved and the job.succeeded arrive, signed, each under
     one webhook-id however often it was retried, and nothing else;
  3. latency: with the receiver up, the time from a job's end to its job.succeeded (printed);
  4. issue 55, item 4, on the same runs: the LOG events of a run (the data read, the model, the
     memory plan's choices, the checkpoint resumed from after the kill), and the daemon's log
     in JSON lines (log.format: json), the failed deliveries' warnings among them.

Prints "webhooks: ok" at the end. Exit status: 0 ok, 1 a check failed, 77 skipped (no test data,
or the SDK or standardwebhooks not installed).
"""
import argparse
import http.server
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

try:
    import oomb
    from oomb.v1 import jobs_pb2
    from standardwebhooks import Webhook
    from test_sdk import TINY, Daemon, Failure, check, expect_error, tiny_dict, write_ids
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"webhooks: skipped: {e} (scripts/setup.sh installs the SDK and standardwebhooks)")
    sys.exit(77)

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver:
    """An HTTP server on a fixed loopback port that verifies each delivery's signature."""

    def __init__(self, port, fail_first=1):
        self.port, self.fail_first = port, fail_first
        self.lock = threading.Lock()
        self.deliveries = []  # (path, webhook-id, status answered, payload)
        self.arrivals = {}  # webhook-id -> when it was first answered 200 (time.time())
        self.server = None

    def start(self):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    payload = Webhook(SECRET).verify(body, dict(self.headers.items()))
                    status = 200
                except Exception as e:  # noqa: BLE001 - a bad signature is answered, then reported
                    payload, status = {"error": str(e)}, 400
                with receiver.lock:
                    if status == 200 and receiver.fail_first > 0:
                        receiver.fail_first -= 1
                        status = 500
                    receiver.deliveries.append((self.path, self.headers.get("webhook-id"), status, payload))
                    if status == 200:
                        receiver.arrivals.setdefault(self.headers.get("webhook-id"), time.time())
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def received(self):
        with self.lock:
            return list(self.deliveries)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_with_hooks(train, steps, every, url, secret_file):
    spec = tiny_dict(train, steps, every)
    spec["checkpoint"]["keep_last"] = 2
    spec["notifications"] = {"webhooks": [{"url": url, "secret_file": secret_file}]}
    return spec


# 1. Errors at submit, naming the field.
def test_errors(client, train, tmp, url, secret_file):
    not_secret = os.path.join(tmp, "not_a_secret")
    with open(not_secret, "w") as f:
        f.write("hunter2\n")
    for secret, url_, field in [(os.path.join(tmp, "missing"), url, "notifications.webhooks[0].secret_file"),
                                (not_secret, url, "notifications.webhooks[0].secret_file"),
                                (not_secret, "ftp://127.0.0.1/x", "notifications.webhooks[0].url"),
                                (secret_file, url.replace("127.0.0.1", "[::1]"), "notifications.webhooks[0].url"),
                                (secret_file, url.replace("127.0.0.1", "2130706434"), "notifications.webhooks[0].url")]:
        e = expect_error(oomb.InvalidArgument,
                         lambda url_=url_, secret=secret: client.jobs.create(job_with_hooks(train, 1, 1, url_, secret)),
                         f"a job with {field} bad")
        check(field in e.message, f"the error does not name {field}: {e.message}")
    print("webhooks: submit-time errors ok", flush=True)


def wait_for_checkpoints(job, n):
    seen = 0
    for e in job.events(follow=True):
        if e.type == jobs_pb2.JobEvent.CHECKPOINT_SAVED:
            seen += 1
            if seen >= n:
                return
    raise Failure(f"{job.name} ended before {n} checkpoints")


# 2. Nothing lost across kill -9, every message signed, one id per message.
def test_durable(daemon, client_of, train, secret_file, receiver):
    url = f"http://127.0.0.1:{receiver.port}"
    client = client_of(daemon)
    job = client.jobs.create(job_with_hooks(train, 300, 40, url + "/job", secret_file), job_id="hooked")
    wait_for_checkpoints(job, 2)
    daemon.proc.kill()  # SIGKILL mid-run, the receiver down: two checkpoints' messages wait
    daemon.proc.wait()
    client.close()
    daemon.start()
    client = client_of(daemon)
    job = client.jobs.get("hooked").wait(timeout=300, poll=0.2)
    check(job.state == oomb.JobState.SUCCEEDED, f"the recovered job: {job.state}")
    events = list(job.events(follow=False))
    check(any(e.state == jobs_pb2.Job.RECOVERING for e in events), "the job was not recovered after the kill")
    logs = [e.message for e in events if e.type == jobs_pb2.JobEvent.LOG]
    for prefix in ("data.train: 8 samples", "model: LlamaForCausalLM from ", "plan: chunks of 32 tokens",
                   "resumed from the checkpoint of step "):
        check(any(m.startswith(prefix) for m in logs), f"no LOG event '{prefix}...' in {logs}")
    daemon.proc.kill()  # again, every message still undelivered
    daemon.proc.wait()
    client.close()
    daemon.start()
    receiver.start()

    expected = {("/job", "checkpoint.saved", e.sequence) for e in events
                if e.type == jobs_pb2.JobEvent.CHECKPOINT_SAVED}
    succeeded = [e.sequence for e in events if e.state == jobs_pb2.Job.SUCCEEDED]
    expected |= {("/job", "job.succeeded", succeeded[0]), ("/project", "job.succeeded", succeeded[0])}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = {(p, d["type"], d["data"]["sequence"]) for p, _, s, d in receiver.received() if s == 200}
        if got >= expected:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # anything else would arrive now
    deliveries = receiver.received()
    bad = [d for d in deliveries if d[2] == 400]
    check(not bad, f"signatures that did not verify: {bad[:3]}")
    got = {(p, d["type"], d["data"]["sequence"]) for p, _, s, d in deliveries if s == 200}
    check(got == expected, f"delivered {sorted(got)}, expected {sorted(expected)}")
    ids = {}
    for p, wid, _s, d in deliveries:
        ids.setdefault((p, d["type"], d["data"]["sequence"]), set()).add(wid)
    check(all(len(v) == 1 for v in ids.values()), f"a message under several webhook-ids: {ids}")
    retried = [d for d in deliveries if d[2] == 500]
    check(len(retried) == 1 and any(d[1] == retried[0][1] and d[2] == 200 for d in deliveries),
          "the message answered 500 was not delivered again under its id")
    final = [d for p, _, s, d in deliveries if p == "/project" and s == 200][0]["data"]
    check(final["job"] == job.name and final["state"] == "SUCCEEDED" and final["progress"]["step"] == "300",
          f"the job.succeeded payload: {final}")
    client.close()
    print(f"webhooks: {len(expected)} messages delivered across two SIGKILLs, {len(deliveries)} attempts "
          "answered", flush=True)


# 3. How soon a platform hears of a job's end.
def test_latency(daemon, client_of, train, secret_file, receiver):
    client = client_of(daemon)
    url = f"http://127.0.0.1:{receiver.port}/job"
    job = client.jobs.create(job_with_hooks(train, 2, 0, url, secret_file), job_id="prompt").wait(timeout=120)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hits = [wid for p, wid, s, d in receiver.received() if s == 200 and d["type"] == "job.succeeded"
                and d["data"]["job"] == job.name]
        if hits:
            break
        time.sleep(0.05)
    check(hits, "no job.succeeded for the second job within 30 s")
    with receiver.lock:
        latency = receiver.arrivals[hits[0]] - job.end_time.timestamp()
    client.close()
    print(f"webhooks: job.succeeded received {latency:.2f} s after the job ended", flush=True)


def check_json_log(daemon):
    with open(daemon.log, errors="replace") as f:
        lines = f.read().splitlines()
    records = []
    for line in lines:
        check(not line.startswith("[20"), f"a text log line with log.format json: {line}")
        if line.startswith("{"):
            records.append(json.loads(line))
    check(records and all({"time", "level", "logger", "message"} <= r.keys() for r in records),
          f"JSON log records: {records[:3]}")
    check(any(r["level"] == "warning" and r["message"].startswith("webhooks: ") for r in records),
          "no JSON warning about the failed deliveries")
    print(f"webhooks: {len(records)} JSON log lines", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("oombd")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(TINY, "config.json")):
        print(f"webhooks: skipped: no tiny test model under {TINY} (scripts/fetch_test_data.sh)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="oomb_webhooks_test_")
    daemon = None
    receiver = Receiver(free_port())
    try:
        train = os.path.join(tmp, "ids.jsonl")
        write_ids(train, 8, 120)
        secret_file = os.path.join(tmp, "hook.secret")
        with open(secret_file, "w") as f:
            f.write(SECRET + "\n")
        projects = os.path.join(tmp, "projects.yaml")
        with open(projects, "w") as f:
            f.write(json.dumps({"projects": {"default": {"webhooks": [
                {"url": f"http://127.0.0.1:{receiver.port}/project", "secret_file": secret_file,
                 "events": ["job_succeeded"]}]}}}))
        daemon = Daemon(a.oombd, os.path.join(tmp, "data"), [
            "--set", f"tenancy.projects_file={projects}", "--set", "outbound.allow=127.0.0.1",
            "--set", "notifications.retry_initial_seconds=1",
            "--set", "notifications.retry_max_seconds=2", "--set", "log.format=json"]).start()

        def client_of(d):
            return oomb.Client(endpoint=d.endpoint)

        client = client_of(daemon)
        test_errors(client, train, tmp, f"http://127.0.0.1:{receiver.port}/job", secret_file)
        client.close()
        test_durable(daemon, client_of, train, secret_file, receiver)
        test_latency(daemon, client_of, train, secret_file, receiver)
        check_json_log(daemon)
    except Failure as e:
        print(f"webhooks: FAILED: {e}")
        if daemon is not None:
            print(daemon.tail(60))
        sys.exit(1)
    finally:
        receiver.stop()
        if daemon is not None:
            daemon.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print("webhooks: ok")


if __name__ == "__main__":
    main()
