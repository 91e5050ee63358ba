#!/usr/bin/env python3
"""Issue 54's integration surface against real daemons: the HTTP/JSON API (httpx and curl, every
route, errors and auth), datasets in and checkpoints out (the SDK, the CLI, HTTP), and jobs that
name an earlier job's checkpoint.

Run by ctest as `http_api` (tests/CMakeLists.txt): test_http_api.py OOMBD OOMB. Sections:

  1. the OpenAPI document: served at /v1/openapi.json, equal to the committed docs/openapi.json,
     a valid OpenAPI 3.0 document (openapi-spec-validator), one operation per method rule;
  2. every route over HTTP with httpx, as two teams and an administrator (a Kubernetes static
     token file): create (the spec as JSON), get, list (a page, filters, projects/-), update
     (update_mask), pause, resume, cancel, events, watch (server-sent events, resumed with
     Last-Event-ID), checkpoints, download (Range: N-, -S, past the end 416; If-Range), a POST
     without a body answered at once, estimate, serverInfo, caller, delete
     (purge), datasets (PUT, get, list, delete); errors as AIP-193 JSON with their HTTP status and
     details (ErrorInfo reason, BadRequest field): 400, 401, 403, 404, 405, 409, 413;
  3. curl alone: a platform with no SDK uploads a dataset, trains on it, watches, downloads the
     adapter, resumes a download cut halfway (Range), and the bytes equal the server's files;
  4. the SDK: datasets.upload (records by kind; the same file again; a bad line named; other
     content under a taken id; max_storage_bytes), a job training on datasets/{id}, job.download
     byte for byte equal to the server's files, a download resumed after being cut halfway, the
     adapter loaded in PEFT giving transformers' logits of the same adapter loaded from the
     server's path, init_adapter naming the job (an evaluate job's loss equal to that of the
     downloaded copy), a checkpoint of another team's job refused; delete with purge, and
     storage.retention_days removing a deleted job's files on the next start;
  5. mTLS over HTTPS: the client certificate's CN is the caller, as over gRPC; 401 without one or
     with one another CA signed.

Prints "http_api: ok" at the end. Exit status: 0 ok, 1 a check failed, 77 skipped (no test data,
no SDK, or no httpx).
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sdk import TINY, Daemon, Failure, check, write_ids  # noqa: E402

try:
    import grpc
    import httpx
    import oomb
    from oomb._transfer import Download
    from oomb.v1 import datasets_pb2, jobs_pb2
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"http_api: skipped: {e} (scripts/setup.sh installs the SDK and httpx)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENS = """alice-token,alice,1001,nlp
bob-token,bob,1002,vision
carol-token,carol,1003,"nlp,vision"
root-token,root,0,oomb:admins
rita-token,rita,1005,nlp
"""


def section(name, started):
    print(f"http_api: {name} ok ({time.monotonic() - started:.1f} s)", flush=True)


def http_port(daemon):
    with open(os.path.join(daemon.dir, "oombd.http.port")) as f:
        return int(f.read().strip())


def tiny_spec(train, steps, every_steps=0, **extra):
    spec = {
        "displayName": "tiny",
        "model": {"path": TINY, "dtype": "float32"},
        "method": {"type": "lora", "lora": {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}},
        "data": {"train": train, "maxSeqLen": 128, "tooLong": "truncate", "packing": False},
        "training": {"maxSteps": steps, "learningRate": 1e-3, "warmupSteps": 0, "lrSchedule": "constant", "seed": 7},
        "memory": {"chunkTokens": 32, "pageTokens": 16},
        "checkpoint": {"everySteps": every_steps, "keepLast": 2},
        "resources": {"device": "cpu", "maxRetries": 0},
    }
    spec.update(extra)
    return spec


class Http:
    """httpx against a daemon's HTTP port as one user."""

    def __init__(self, port, token=None, scheme="http", **kwargs):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.c = httpx.Client(base_url=f"{scheme}://127.0.0.1:{port}", headers=headers, timeout=60, **kwargs)

    def __getattr__(self, verb):
        return getattr(self.c, verb)

    def ok(self, method, url, **kwargs):
        r = self.c.request(method, url, **kwargs)
        check(r.status_code == 200, f"{method} {url}: {r.status_code} {r.text[:500]}")
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r

    def error(self, method, url, status, grpc_code, **kwargs):
        r = self.c.request(method, url, **kwargs)
        check(r.status_code == status, f"{method} {url}: {r.status_code}, expected {status}: {r.text[:500]}")
        body = r.json()
        check(body["error"]["code"] == status and body["error"]["status"] == grpc_code,
              f"{method} {url}: error {body}")
        return body["error"]


def wait_state(http, name, states, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        job = http.ok("GET", f"/v1/{name}")
        if job["state"] in states:
            return job
        check(time.monotonic() < deadline, f"{name} still {job['state']} after {timeout} s")
        time.sleep(0.1)


def sse_events(http, url, headers=None, limit=10000):
    """The server-sent events of `url`, as (event, id, data) until the stream's `end`."""
    out = []
    with http.c.stream("GET", url, headers=headers or {}, timeout=120) as r:
        check(r.status_code == 200, f"GET {url}: {r.status_code} {r.read()[:300]}")
        check(r.headers["content-type"].startswith("text/event-stream"), f"content type {r.headers['content-type']}")
        event = {}
        for line in r.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if event:
                    out.append((event.get("event"), event.get("id"), json.loads(event.get("data", "{}"))))
                    if event.get("event") == "end" or len(out) >= limit:
                        return out
                event = {}
                continue
            key, _, value = line.partition(": ")
            event[key] = value
    return out


# 1. The OpenAPI document.
def test_openapi(http, oombd):
    t = time.monotonic()
    served = http.ok("GET", "/v1/openapi.json")
    with open(os.path.join(ROOT, "docs", "openapi.json")) as f:
        committed = json.load(f)
    check(served == committed, "docs/openapi.json differs from the served document: run "
                               "`oombd openapi > docs/openapi.json`")
    printed = subprocess.run([oombd, "openapi"], capture_output=True, text=True)
    check(printed.returncode == 0 and json.loads(printed.stdout) == served,
          "`oombd openapi` differs from the served one")
    try:
        from openapi_spec_validator import validate
    except ImportError:  # pragma: no cover
        validate = None
    if validate is not None:
        validate(served)
    operations = {op["operationId"] for path in served["paths"].values() for op in path.values()}
    for method in ("CreateJob", "GetJob", "ListJobs", "CancelJob", "PauseJob", "ResumeJob", "DeleteJob",
                   "ListJobEvents", "WatchJob", "ListCheckpoints", "DownloadCheckpoint", "EstimateJob", "UpdateJob",
                   "GetServerInfo", "GetCaller", "UploadDataset", "GetDataset", "ListDatasets", "DeleteDataset"):
        check(method in operations, f"the OpenAPI document has no operation {method}")
    check("/v1/projects/{project}/jobs/{job}:cancel" in served["paths"], sorted(served["paths"]))
    section("OpenAPI document (served = committed = oombd openapi, valid)", t)


def check_download_ends_when_revoked(daemon, tmp, checkpoint):
    """Issue 78's low finding: a download went on for 30 s after its token was revoked (watches
    ended at once). rita reads a 256 MiB checkpoint slowly; her token is revoked; the stream
    ends within seconds, short of the archive's size."""
    big = os.path.join(checkpoint["path"], "zz-padding.bin")
    with open(big, "wb") as f:
        f.truncate(256 << 20)
    try:
        rita = Http(http_port(daemon), "rita-token")
        got, cut, revoked_at = 0, None, None
        with rita.c.stream("GET", f"/v1/{checkpoint['name']}:download", timeout=60) as r:
            check(r.status_code == 200, f"rita's download: {r.status_code}")
            size = int(r.headers["content-length"])
            try:
                for chunk in r.iter_bytes(1 << 16):
                    got += len(chunk)
                    if revoked_at is None and got >= 4 << 20:
                        with open(os.path.join(tmp, "tokens.csv"), "w") as f:
                            f.write(TOKENS.replace("rita-token,rita,1005,nlp\n", ""))
                        revoked_at = time.monotonic()
                    if revoked_at is not None:
                        time.sleep(0.002)  # a slow reader: ~30 MB/s
                        check(time.monotonic() - revoked_at < 15, "the download went on 15 s after the revocation")
            except httpx.HTTPError as e:
                cut = e
        check(revoked_at is not None and got < size, f"read {got} of {size} bytes: not cut after the revocation")
        check(cut is not None, "the cut download ended without an error")
        print(f"http_api: a revoked token's download cut {time.monotonic() - revoked_at:.1f} s after the "
              f"revocation, at {got >> 20} of {size >> 20} MiB", flush=True)
    finally:
        os.remove(big)
        with open(os.path.join(tmp, "tokens.csv"), "w") as f:
            f.write(TOKENS)


# 2. Every route with httpx.
def test_routes(daemon, tmp, train):
    t = time.monotonic()
    port = http_port(daemon)
    alice, bob, carol, root = (Http(port, f"{u}-token") for u in ("alice", "bob", "carol", "root"))
    anon = Http(port)
    # Who calls.
    check(alice.ok("GET", "/v1/caller")["user"] == "alice", "caller")
    check(anon.error("GET", "/v1/caller", 401, "UNAUTHENTICATED"), "no token")
    health = anon.get("/healthz")
    check(health.status_code == 200 and health.json() == {"status": "SERVING"}, f"/healthz: {health.text[:200]}")
    check(Http(port, "nope").error("GET", "/v1/serverInfo", 401, "UNAUTHENTICATED"), "bad token")
    # The scheme is case-insensitive (RFC 9110 §11.1; issue 78's low finding): "bearer" and "BEARER" are
    # "Bearer"; another scheme is still refused.
    for scheme in ("bearer", "BEARER"):
        r = httpx.get(f"http://127.0.0.1:{port}/v1/caller", headers={"Authorization": f"{scheme} alice-token"})
        check(r.status_code == 200 and r.json()["user"] == "alice", f"{scheme}: {r.status_code} {r.text[:200]}")
    r = httpx.get(f"http://127.0.0.1:{port}/v1/caller", headers={"Authorization": "Basic alice-token"})
    check(r.status_code == 401, f"Basic: {r.status_code} {r.text[:200]}")
    check(root.ok("GET", "/v1/serverInfo")["version"], "serverInfo")
    # Create: the spec as JSON, ids and request ids in the query.
    spec = tiny_spec(train, 3, every_steps=1)
    job = alice.ok("POST", "/v1/projects/nlp/jobs", params={"job_id": "h1", "request_id": "r-h1"}, json=spec)
    check(job["name"] == "projects/nlp/jobs/h1" and job["creator"] == "alice", f"created {job}")
    again = alice.ok("POST", "/v1/projects/nlp/jobs", params={"job_id": "h1", "request_id": "r-h1"}, json=spec)
    check(again["name"] == job["name"], "the same request_id gives the same job")
    taken = alice.error("POST", "/v1/projects/nlp/jobs", 409, "ALREADY_EXISTS", params={"job_id": "h1"}, json=spec)
    check("h1" in taken["message"], taken)
    bad = alice.error("POST", "/v1/projects/nlp/jobs", 400, "INVALID_ARGUMENT",
                      json=dict(spec, training={"maxSteps": 3, "learningRate": -1}))
    reasons = {d.get("reason") for d in bad.get("details", [])}
    fields = {v["field"] for d in bad.get("details", []) for v in d.get("fieldViolations", [])}
    check("BAD_SPEC" in reasons and "spec.training.learning_rate" in fields, f"details {bad}")
    check(alice.error("POST", "/v1/projects/nlp/jobs", 400, "INVALID_ARGUMENT", json={"nope": 1}), "unknown field")
    check(alice.error("POST", "/v1/projects/vision/jobs", 403, "PERMISSION_DENIED", json=spec), "another project")
    check(alice.error("POST", "/v1/projects/nlp/jobs", 413, "INVALID_ARGUMENT",
                      content=b"{" + b" " * (5 << 20) + b"}"), "a body over 4 MiB")
    # Read it: by its owner team, not by another.
    done = wait_state(alice, "projects/nlp/jobs/h1", {"SUCCEEDED", "FAILED"})
    check(done["state"] == "SUCCEEDED", f"h1 ended {done['state']}: {done.get('error')}")
    check(bob.error("GET", "/v1/projects/nlp/jobs/h1", 404, "NOT_FOUND"), "another team's job")
    check(bob.error("POST", "/v1/projects/nlp/jobs/h1:cancel", 404, "NOT_FOUND"), "another team cancels")
    check(bob.error("GET", "/v1/projects/nlp/jobs", 403, "PERMISSION_DENIED"), "another team lists")
    listed = carol.ok("GET", "/v1/projects/-/jobs")
    check([j["name"] for j in listed["jobs"]] == ["projects/nlp/jobs/h1"], f"carol lists {listed}")
    check(alice.ok("GET", "/v1/projects/nlp/jobs", params={"states": "QUEUED"}) == {}, "a state filter")
    # Events and the watch stream (the job has ended: the stream replays and ends).
    events = alice.ok("GET", "/v1/projects/nlp/jobs/h1/events")["events"]
    check([int(e["sequence"]) for e in events] == list(range(1, len(events) + 1)), "events in order")
    stream = sse_events(alice, "/v1/projects/nlp/jobs/h1:watch")
    check(stream[0][0] == "snapshot" and stream[-1][0] == "end" and stream[-1][2] == {}, f"watch {stream[:1]}")
    seqs = [int(d["event"]["sequence"]) for kind, _, d in stream if kind == "event"]
    check(seqs == list(range(1, len(events) + 1)), f"watched {seqs}")
    resumed = sse_events(alice, "/v1/projects/nlp/jobs/h1:watch", headers={"Last-Event-ID": "3"})
    check([int(d["event"]["sequence"]) for k, _, d in resumed if k == "event"][0] == 4, "Last-Event-ID resumes")
    # Checkpoints, and the download with Range.
    cps = alice.ok("GET", "/v1/projects/nlp/jobs/h1/checkpoints")["checkpoints"]
    final = [c for c in cps if c.get("final")]
    check(final and final[0]["name"] == "projects/nlp/jobs/h1/checkpoints/final", f"checkpoints {cps}")
    whole = alice.get("/v1/projects/nlp/jobs/h1/checkpoints/final:download")
    check(whole.status_code == 200 and whole.headers["content-type"] == "application/x-tar", whole.status_code)
    etag = whole.headers["etag"]
    members = tarfile.open(fileobj=io.BytesIO(whole.content)).getnames()
    check("final/adapter_model.safetensors" in members and "final/oomb_checkpoint.json" in members, members)
    half = len(whole.content) // 2
    tail = alice.get("/v1/projects/nlp/jobs/h1/checkpoints/final:download",
                     headers={"Range": f"bytes={half}-", "If-Range": etag})
    check(tail.status_code == 206 and tail.content == whole.content[half:], f"Range: {tail.status_code}")
    check(tail.headers["content-range"] == f"bytes {half}-{len(whole.content) - 1}/{len(whole.content)}",
          tail.headers.get("content-range"))
    stale = alice.get("/v1/projects/nlp/jobs/h1/checkpoints/final:download",
                      headers={"Range": f"bytes={half}-", "If-Range": '"0000"'})
    check(stale.status_code == 200 and stale.content == whole.content, "If-Range with another etag: all of it")
    # Issue 78's low finding: a suffix range (the last N bytes) was ignored, a range past the end
    # not answered 416.
    size = len(whole.content)
    last = alice.get("/v1/projects/nlp/jobs/h1/checkpoints/final:download", headers={"Range": "bytes=-100"})
    check(last.status_code == 206 and last.content == whole.content[-100:] and
          last.headers["content-range"] == f"bytes {size - 100}-{size - 1}/{size}",
          f"suffix range: {last.status_code} {last.headers.get('content-range')} {len(last.content)} bytes")
    more = alice.get("/v1/projects/nlp/jobs/h1/checkpoints/final:download", headers={"Range": f"bytes=-{size * 2}"})
    check(more.status_code == 206 and more.content == whole.content,
          f"a suffix longer than the archive: {more.status_code}")
    for past in ("bytes=99999999999-", f"bytes={size}-", "bytes=-0"):
        r = alice.get("/v1/projects/nlp/jobs/h1/checkpoints/final:download", headers={"Range": past})
        check(r.status_code == 416 and r.headers.get("content-range") == f"bytes */{size}",
              f"Range {past}: {r.status_code} {r.headers.get('content-range')} {r.text[:200]}")
    check_download_ends_when_revoked(daemon, tmp, final[0])
    # Issue 78's low finding: a POST with neither a body nor Content-Length hung until the client
    # gave up; it is a request with an empty body.
    with socket.create_connection(("127.0.0.1", http_port(daemon)), timeout=10) as raw:
        raw.sendall(b"POST /v1/projects/nlp/jobs HTTP/1.1\r\nHost: oomb\r\nAuthorization: Bearer alice-token\r\n\r\n")
        answer = raw.recv(4096)
        check(answer.startswith(b"HTTP/1.1 400"), f"a POST without a body: {answer[:200]!r}")
    check(alice.error("GET", "/v1/projects/nlp/jobs/h1/checkpoints/999:download", 404, "NOT_FOUND"), "no such step")
    check(bob.error("GET", "/v1/projects/nlp/jobs/h1/checkpoints/final:download", 404, "NOT_FOUND"), "another team")
    # Update, pause, resume, cancel on a job that waits (a second one, held behind a long one).
    long_spec = tiny_spec(train, 100000)
    alice.ok("POST", "/v1/projects/nlp/jobs", params={"job_id": "h2"}, json=long_spec)
    wait_state(alice, "projects/nlp/jobs/h2", {"RUNNING"})
    updated = alice.ok("PATCH", "/v1/projects/nlp/jobs/h2", params={"update_mask": "labels,priority"},
                       json={"labels": {"team": "nlp"}, "priority": 3})
    check(updated["labels"] == {"team": "nlp"} and updated["priority"] == 3, f"updated {updated}")
    check(alice.error("PATCH", "/v1/projects/nlp/jobs/h2", 400, "INVALID_ARGUMENT",
                      params={"update_mask": "spec.model"}, json={}), "update of another field")
    check(alice.ok("POST", "/v1/projects/nlp/jobs/h2:pause", json={})["state"] in ("PAUSING", "PAUSED"), "pause")
    wait_state(alice, "projects/nlp/jobs/h2", {"PAUSED"})
    check(alice.ok("POST", "/v1/projects/nlp/jobs/h2:resume", json={})["state"] == "QUEUED", "resume")
    check(alice.ok("POST", "/v1/projects/nlp/jobs/h2:cancel", json={})["state"] in ("CANCELLING", "CANCELLED"),
          "cancel")
    wait_state(alice, "projects/nlp/jobs/h2", {"CANCELLED"})
    check(alice.error("POST", "/v1/projects/nlp/jobs/h2:pause", 400, "FAILED_PRECONDITION", json={}), "pause ended")
    # Estimate.
    estimate = alice.ok("POST", "/v1/projects/nlp/jobs:estimate", json=spec)
    check(estimate["fits"] and int(estimate["seqLen"]) == 128, f"estimate {estimate}")
    # Routes that do not exist, and methods a path does not take.
    check(alice.error("GET", "/v1/nothing", 404, "NOT_FOUND"), "no route")
    check(alice.error("PUT", "/v1/projects/nlp/jobs/h2", 405, "NOT_FOUND"), "no such method")
    # Datasets: the raw file as the PUT body.
    with open(train, "rb") as f:
        raw = f.read()
    d = alice.ok("PUT", "/v1/projects/nlp/datasets/ids", content=raw,
                 params={"sha256": hashlib.sha256(raw).hexdigest(), "display_name": "ids"})
    check(d["name"] == "projects/nlp/datasets/ids" and int(d["records"]) == 4
          and d["recordKinds"] == {"input_ids": "4"}, f"dataset {d}")
    check(alice.error("PUT", "/v1/projects/nlp/datasets/bad", 400, "INVALID_ARGUMENT", content=b'{"text": 5}\n'),
          "a bad record")
    check(alice.ok("GET", "/v1/projects/nlp/datasets/ids")["sha256"] == hashlib.sha256(raw).hexdigest(), "get")
    check([x["name"] for x in alice.ok("GET", "/v1/projects/nlp/datasets")["datasets"]] == [d["name"]], "list")
    check(bob.error("GET", "/v1/projects/nlp/datasets/ids", 404, "NOT_FOUND"), "another team's dataset")
    check(alice.ok("DELETE", "/v1/projects/nlp/datasets/ids") == {}, "delete")
    check(alice.error("GET", "/v1/projects/nlp/datasets/ids", 404, "NOT_FOUND"), "deleted")
    # Delete with purge: the job's files go.
    checkpoint_dir = done["checkpointDir"]
    check(os.path.isdir(checkpoint_dir), checkpoint_dir)
    check(alice.ok("DELETE", "/v1/projects/nlp/jobs/h1", params={"purge": "true"}) == {}, "delete purge")
    check(not os.path.exists(checkpoint_dir), f"purge left {checkpoint_dir}")
    section("every route over HTTP (httpx), errors and auth", t)


# 3. curl alone.
def test_curl(daemon, tmp, train):
    t = time.monotonic()
    port = http_port(daemon)
    base = f"http://127.0.0.1:{port}/v1"
    auth = ["-H", "Authorization: Bearer alice-token"]

    def curl(*args, ok=True):
        r = subprocess.run(["curl", "-sS", "--fail-with-body", *auth, *args], capture_output=True)
        check(not ok or r.returncode == 0, f"curl {args}: {r.returncode} {r.stdout[:300]!r} {r.stderr[:300]!r}")
        return r.stdout

    d = json.loads(curl("-X", "PUT", "--data-binary", f"@{train}", f"{base}/projects/nlp/datasets/c1"))
    check(d["name"] == "projects/nlp/datasets/c1", d)
    spec_file = os.path.join(tmp, "curl-spec.json")
    with open(spec_file, "w") as f:
        json.dump(tiny_spec("datasets/c1", 3), f)
    job = json.loads(curl("-X", "POST", "-H", "Content-Type: application/json", "--data-binary", f"@{spec_file}",
                          f"{base}/projects/nlp/jobs?job_id=c1"))
    check(job["name"] == "projects/nlp/jobs/c1", job)
    watched = curl("-N", f"{base}/projects/nlp/jobs/c1:watch").decode()
    check("event: end" in watched and '"state":"SUCCEEDED"' in watched, watched[-500:])
    tar = curl(f"{base}/projects/nlp/jobs/c1/checkpoints/final:download")
    cut = len(tar) // 2
    head = curl("-r", f"0-{cut - 1}", f"{base}/projects/nlp/jobs/c1/checkpoints/final:download")
    rest = curl("-r", f"{cut}-", f"{base}/projects/nlp/jobs/c1/checkpoints/final:download")
    check(head + rest == tar, "two ranges make the archive")
    server_dir = json.loads(curl(f"{base}/projects/nlp/jobs/c1"))["checkpointDir"] + "/final"
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for m in archive.getmembers():
            if m.isfile():
                with open(os.path.join(server_dir, os.path.basename(m.name)), "rb") as f:
                    check(archive.extractfile(m).read() == f.read(), f"{m.name} differs from the server's")
    section("a platform with curl alone: upload, train, watch, download in two ranges", t)


def logits(adapter_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(TINY, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        return model(torch.arange(3, 40).unsqueeze(0)).logits


# 4. The SDK: datasets, training on one, downloads, init_adapter by name, purge, retention.
def test_sdk_transfers(daemon, tmp, train, oomb_cli):
    t = time.monotonic()
    alice = oomb.Client(endpoint=daemon.endpoint, token="alice-token")
    bob = oomb.Client(endpoint=daemon.endpoint, token="bob-token")
    text = os.path.join(tmp, "mixed.jsonl")
    with open(text, "w") as f:
        f.write('{"text": "hello"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n'
                '{"prompt": "a", "completion": "b"}\n{"input_ids": [5, 6], "labels": [-100, 6]}\n')
    mixed = alice.datasets.upload(text)
    check(mixed.records == 4 and mixed.record_kinds == {"text": 1, "messages": 1, "prompt_completion": 1,
                                                        "input_ids": 1}, f"kinds {mixed}")
    check(alice.datasets.upload(text).name == mixed.name, "the same file again: the same dataset")
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"text": "ok"}\n{"input_ids": [1, -2]}\n')
    e = None
    try:
        alice.datasets.upload(bad)
    except oomb.InvalidArgument as err:
        e = err
    check(e is not None and "data: bad.jsonl:2: input_ids[1]" in e.message, f"bad line: {e}")
    # Uploads past the 16 MiB the server's check may lag behind (the client is held back): every
    # line counted; a bad first line ends the upload, its temporary file removed.
    line = json.dumps({"input_ids": list(range(1000))}) + "\n"
    big = os.path.join(tmp, "big.jsonl")
    with open(big, "w") as f:
        f.write(line * 12000)
    counted = alice.datasets.upload(big, dataset_id="big")
    check(counted.records == 12000 and counted.record_kinds == {"input_ids": 12000}, f"big upload {counted}")
    alice.datasets.delete("big")
    with open(big, "w") as f:
        f.write('{"input_ids": [1, "x"]}\n' + line * 12000)
    try:
        alice.datasets.upload(big, dataset_id="big-bad")
        raise Failure("a dataset with a bad first line was accepted")
    except oomb.InvalidArgument as err:
        check("data: big.jsonl:1: input_ids[1]" in err.message, err.message)
    # The hash in a last message (how a named upload is sent): checked as the first message's is.
    body = b'{"input_ids": [1, 2]}\n'
    for hashes, want in (([None, hashlib.sha256(body).hexdigest()], None),
                         ([None, "0" * 64], "sha256: " + "0" * 64 + " declared"),
                         ([hashlib.sha256(body).hexdigest()] * 2, "sha256: given in more than one message")):
        first = datasets_pb2.UploadDatasetRequest(parent="projects/nlp", dataset_id="late", data=body,
                                                  sha256=hashes[0] or "")
        last = datasets_pb2.UploadDatasetRequest(sha256=hashes[1])  # no data: the hash alone
        try:
            got = alice.datasets.stub.UploadDataset(iter([first, last]), metadata=alice.metadata)
            check(want is None and got.sha256 == hashlib.sha256(body).hexdigest(), f"late hash: {got}")
            alice.datasets.delete("late")
        except grpc.RpcError as err:
            check(want is not None and want in err.details(), f"late hash {hashes}: {err.details()}")
    left = [n for _, _, names in os.walk(daemon.dir) for n in names if n.startswith(".upload-")]
    check(not left, f"temporary upload files left: {left}")
    try:
        alice.datasets.upload(train, dataset_id=mixed.id)
        raise Failure("other content under a taken id was accepted")
    except oomb.AlreadyExists:
        pass
    ids = alice.datasets.upload(train, dataset_id="ids")
    listed = [d.id for d in alice.datasets.list()]
    check(listed[:2] == ["ids", mixed.id] and "c1" in listed, f"list, newest first: {listed}")
    check(not list(bob.datasets.list()), "bob sees none of nlp's datasets")
    # Train on the uploaded dataset; download the adapter.
    spec = {"model": {"path": TINY, "dtype": "float32"},
            "method": {"type": "lora", "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
            "data": {"train": ids.spec_name, "max_seq_len": 128, "too_long": "truncate", "packing": False},
            "training": {"max_steps": 4, "learning_rate": 1e-3, "warmup_steps": 0, "lr_schedule": "constant"},
            "memory": {"chunk_tokens": 32, "page_tokens": 16}, "checkpoint": {"every_steps": 2},
            "resources": {"device": "cpu", "max_retries": 0}}
    job = alice.jobs.create(spec, job_id="s1").wait(timeout=120)
    local = job.download(os.path.join(tmp, "s1-final"))
    server = os.path.join(job.checkpoint_dir, "final")
    for name in os.listdir(server):
        with open(os.path.join(server, name), "rb") as a, open(os.path.join(local, name), "rb") as b:
            check(a.read() == b.read(), f"{name}: the downloaded copy differs from the server's")
    check(sorted(os.listdir(local)) == sorted(os.listdir(server)), f"left beside the files: {os.listdir(local)}")
    # A download cut off in the middle of the archive's second file, then resumed from that
    # file's header: the stream's messages cut into 4 KiB pieces, the first attempt's stream
    # broken off (UNAVAILABLE) there.
    stream = alice.stub.DownloadCheckpoint(jobs_pb2.DownloadCheckpointRequest(name=f"{job.name}/checkpoints/2"),
                                           metadata=alice.metadata)
    archive, data = None, b""
    for m in stream:
        if m.HasField("archive"):
            archive = m.archive
        else:
            data += m.data
    with tarfile.open(fileobj=io.BytesIO(data)) as packed:
        files = [m for m in packed.getmembers() if m.isfile()]
    check(len(files) >= 2 and files[1].size > 1, f"the archive's files {[m.name for m in files]}")
    cut = files[1].offset_data + files[1].size // 2

    class Cut(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

    def cut_stream():
        yield jobs_pb2.DownloadCheckpointResponse(archive=archive)
        for at in range(0, cut, 4096):
            yield jobs_pb2.DownloadCheckpointResponse(data=data[at:min(at + 4096, cut)])
        raise Cut()

    cut_dir, cli_dir = os.path.join(tmp, "s1-step2"), os.path.join(tmp, "s1-step2-cli")
    first = Download(f"{job.name}/checkpoints/2", cut_dir)
    try:
        first.unpack(cut_stream())
        raise Failure("the cut stream unpacked")
    except Cut as e:
        check(first.retry_after(e, 0) > 0, "a cut stream is retried")
    with open(os.path.join(cut_dir, ".oomb-download")) as f:
        check(f.read().split() == [archive.etag, str(files[1].offset)], "the state after the cut")
    done = os.path.join(cut_dir, os.path.basename(files[0].name))
    check(sorted(os.listdir(cut_dir)) == sorted([".oomb-download", os.path.basename(done)]),
          f"after the cut: {os.listdir(cut_dir)}")
    shutil.copytree(cut_dir, cli_dir)
    inode = os.stat(done).st_ino
    step2 = [c for c in job.checkpoints() if c.step == 2 and not c.final][0]
    step2.download(cut_dir)  # resumes at the second file
    check(os.stat(done).st_ino == inode, "the file finished before the cut was downloaded again")
    # The CLI resumes from the same state.
    r = subprocess.run([oomb_cli, "--endpoint", daemon.endpoint, "download", "s1", "2", "--dir", cli_dir],
                       capture_output=True, text=True, env=dict(os.environ, OOMB_TOKEN="alice-token"))
    check(r.returncode == 0, f"oomb download, resumed: {r.returncode} {r.stderr}")
    for d in (cut_dir, cli_dir):
        check(sorted(os.listdir(d)) == sorted(os.listdir(step2.path)), f"{d}: {os.listdir(d)}")
        for name in os.listdir(step2.path):
            with open(os.path.join(step2.path, name), "rb") as a, open(os.path.join(d, name), "rb") as b:
                check(a.read() == b.read(), f"{d}: {name}: the resumed download differs")
    # PEFT loads the downloaded adapter, with the logits of the server's copy.
    import torch
    check(torch.equal(logits(local), logits(server)), "the downloaded adapter gives other logits")
    # A missing job and another team's job: NOT_FOUND, as over HTTP and in the SDK, and no directory
    # left behind (issue 78's low finding: DATA_LOSS "an empty stream" and an empty directory).
    for who, job_id in (("alice-token", "no-such-job"), ("bob-token", "s1")):
        missing = os.path.join(tmp, f"cli-missing-{who}")
        r = subprocess.run([oomb_cli, "--endpoint", daemon.endpoint, "download", job_id, "--dir", missing],
                           capture_output=True, text=True, env=dict(os.environ, OOMB_TOKEN=who))
        check(r.returncode != 0 and "NOT_FOUND" in r.stderr and "DATA_LOSS" not in r.stderr,
              f"oomb download {job_id} as {who}: {r.returncode} {r.stderr}")
        check(not os.path.exists(missing), f"oomb download {job_id} as {who} left {missing}")
    # The CLI downloads too.
    r = subprocess.run([oomb_cli, "--endpoint", daemon.endpoint, "download", "s1", "--dir", os.path.join(tmp, "cli")],
                       capture_output=True, text=True, env=dict(os.environ, OOMB_TOKEN="alice-token"))
    check(r.returncode == 0 and os.path.isfile(os.path.join(tmp, "cli", "adapter_model.safetensors")),
          f"oomb download: {r.returncode} {r.stderr}")
    # init_adapter by name: an evaluate job of the job's final checkpoint, and of the downloaded copy.
    val = os.path.join(tmp, "val.jsonl")
    write_ids(val, 2, 100, seed=9)

    def evaluate(adapter, job_id, client=alice):
        e = {"model": {"path": TINY, "dtype": "float32"},
             "method": {"type": "evaluate", "lora": {"init_adapter": adapter}},
             "data": {"validation": val, "max_seq_len": 128},
             "memory": {"chunk_tokens": 32, "page_tokens": 16}, "resources": {"device": "cpu"}}
        return client.jobs.create(e, job_id=job_id).wait(timeout=120).progress.eval_loss

    by_name = evaluate("projects/nlp/jobs/s1", "e-name")
    by_path = evaluate(local, "e-path")
    check(by_name == by_path and by_name > 0, f"eval loss by name {by_name}, by path {by_path}")
    by_step = evaluate("projects/nlp/jobs/s1/checkpoints/2", "e-step")
    check(by_step > 0 and by_step != by_name, f"step 2's loss {by_step}")
    try:
        bob.jobs.create({"model": {"path": TINY}, "method": {"type": "evaluate",
                                                             "lora": {"init_adapter": "projects/nlp/jobs/s1"}},
                         "data": {"validation": val}, "resources": {"device": "cpu"}})
        raise Failure("bob named nlp's checkpoint")
    except oomb.InvalidArgument as err:
        check("no job projects/nlp/jobs/s1" in err.message, err.message)
    # Delete: without purge the files stay (retention removes them later), with purge they go.
    alice.jobs.delete("e-path")
    alice.jobs.delete("s1", purge=True)
    check(not os.path.exists(job.checkpoint_dir), "purge left the checkpoints")
    alice.datasets.delete(mixed.id)
    check(not os.path.exists(os.path.join(daemon.dir, "datasets", "nlp", f"{mixed.id}.jsonl")), "the file stayed")
    alice.close()
    bob.close()
    section("SDK: datasets, training on one, downloads (resumed), PEFT, init_adapter by name, purge", t)


def test_retention(oombd, tmp, train):
    t = time.monotonic()
    data = os.path.join(tmp, "retention")
    daemon = Daemon(oombd, data).start()
    try:
        c = oomb.Client(endpoint=daemon.endpoint)
        spec = {"model": {"path": TINY, "dtype": "float32"},
                "method": {"type": "lora", "lora": {"rank": 4, "target_modules": ["q_proj"]}},
                "data": {"train": train, "max_seq_len": 128}, "training": {"max_steps": 1},
                "memory": {"chunk_tokens": 32, "page_tokens": 16}, "resources": {"device": "cpu"}}
        for jid in ("old", "kept"):
            c.jobs.create(spec, job_id=jid).wait(timeout=60)
        c.jobs.delete("old")
        c.close()
    finally:
        daemon.stop()
    old = os.path.join(data, "jobs", "old")
    check(os.path.isdir(old), "the deleted job's files should stay until retention")
    week_ago = time.time() - 8 * 86400
    os.utime(old, (week_ago, week_ago))
    os.utime(os.path.join(data, "jobs", "kept"), (week_ago, week_ago))
    daemon = Daemon(oombd, data, ["--set", "storage.retention_days=7"]).start()
    try:
        deadline = time.monotonic() + 10
        while os.path.exists(old) and time.monotonic() < deadline:
            time.sleep(0.1)
        check(not os.path.exists(old), "retention did not remove the deleted job's files")
        check(os.path.isdir(os.path.join(data, "jobs", "kept")), "retention removed a job still in the store")
    finally:
        daemon.stop()
    section("storage.retention_days", t)


# 5. mTLS over HTTPS.
def test_mtls(oombd, tmp, train):
    t = time.monotonic()
    d = os.path.join(tmp, "tls")
    os.makedirs(d)
    cmd = ("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca && "
           "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 && "
           "printf 'subjectAltName=IP:127.0.0.1' > san.ext && "
           "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
           "-extfile san.ext && "
           "openssl req -newkey rsa:2048 -nodes -keyout frank.key -out frank.csr -subj '/CN=frank/O=nlp' && "
           "openssl x509 -req -in frank.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out frank.pem -days 2")
    r = subprocess.run(cmd, shell=True, cwd=d, capture_output=True, text=True)
    check(r.returncode == 0, r.stderr)
    daemon = Daemon(oombd, os.path.join(tmp, "tls-data"),
                    ["--set", f"tls.cert_file={d}/server.pem", "--set", f"tls.key_file={d}/server.key",
                     "--set", f"tls.client_ca_file={d}/ca.pem"]).start()
    try:
        port = http_port(daemon)
        tls = ssl.create_default_context(cafile=f"{d}/ca.pem")
        tls.load_cert_chain(f"{d}/frank.pem", f"{d}/frank.key")
        frank = Http(port, scheme="https", verify=tls)
        caller = frank.ok("GET", "/v1/caller")
        check(caller["user"] == "frank" and caller["authenticatedBy"] == "certificate" and
              caller["projects"] == ["projects/nlp"], f"caller {caller}")
        job = frank.ok("POST", "/v1/projects/nlp/jobs", params={"validate_only": "true"},
                       json=tiny_spec(train, 1))
        check(job["spec"]["data"]["train"] == train, job)
        # Without a certificate: 401 naming what is missing, before any method runs.
        r = httpx.get(f"https://127.0.0.1:{port}/v1/caller", verify=f"{d}/ca.pem", timeout=10)
        check(r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED" and
              "tls.client_ca_file" in r.json()["error"]["message"],
              f"an HTTPS client without a certificate: {r.status_code} {r.text[:300]}")
        # A certificate of another CA is no better.
        other = ("openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 2 "
                 "-subj '/CN=mallory/O=nlp'")
        check(subprocess.run(other, shell=True, cwd=d, capture_output=True).returncode == 0, "openssl")
        stranger = ssl.create_default_context(cafile=f"{d}/ca.pem")
        stranger.load_cert_chain(f"{d}/other.pem", f"{d}/other.key")
        try:
            r = httpx.get(f"https://127.0.0.1:{port}/v1/caller", verify=stranger, timeout=10)
            check(r.status_code == 401, f"a certificate of another CA: {r.status_code} {r.text[:300]}")
        except httpx.HTTPError:
            pass  # refused in the handshake: as good
        # Metadata a caller sends cannot claim an identity: only the gateway's key makes it believed.
        forged = httpx.get(f"https://127.0.0.1:{port}/v1/caller", verify=tls,
                           headers={"x-oomb-gateway-cn": "root", "x-oomb-gateway-subject": "CN=root,O=oomb:admins"})
        check(forged.json()["user"] == "frank", f"forged headers changed the caller: {forged.text}")
    finally:
        daemon.stop()
    section("mTLS over HTTPS: the certificate's CN is the caller", t)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("oombd")
    p.add_argument("oomb")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(TINY, "config.json")):
        print(f"http_api: skipped: no tiny test model under {TINY} (scripts/fetch_test_data.sh)")
        sys.exit(77)
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="oomb_http_test_")
    daemons = []
    try:
        train = os.path.join(tmp, "ids.jsonl")
        write_ids(train, 4, 100)
        tokens = os.path.join(tmp, "tokens.csv")
        with open(tokens, "w") as f:
            f.write(TOKENS)
        daemon = Daemon(a.oombd, os.path.join(tmp, "data"),
                        ["--set", f"auth.tokens_file={tokens}", "--set", "scheduler.preemption=none"]).start()
        daemons.append(daemon)
        test_openapi(Http(http_port(daemon), "root-token"), a.oombd)
        test_routes(daemon, tmp, train)
        test_curl(daemon, tmp, train)
        test_sdk_transfers(daemon, tmp, train, a.oomb)
        daemon.stop()
        test_retention(a.oombd, tmp, train)
        test_mtls(a.oombd, tmp, train)
    except Failure as e:
        print(f"http_api: FAILED: {e}", file=sys.stderr)
        for d in daemons:
            print(f"--- {d.log}:\n{d.tail()}", file=sys.stderr)
        sys.exit(1)
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"http_api: every section passed in {time.monotonic() - started:.1f} s")
    print("http_api: ok")


if __name__ == "__main__":
    main()
