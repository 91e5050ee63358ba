#!/usr/bin/env python3
"""The Python SDK (client/python, package `oomb`; issue 54) against the real daemon.

Run by ctest as `python_sdk` (tests/CMakeLists.txt): test_sdk.py OOMBD. Uses the SDK installed in
the venv (scripts/setup.sh), after checking that it is client/python's, and:

  1. the build: `pip wheel` of a copy of client/python + proto/ generates oomb/v1's modules
     (messages, stubs, .pyi, grpc.health.v1) into the wheel and nothing into the sources;
  2. without a daemon: specs from dicts, YAML text, files (relative paths resolved against the
     file's directory, `auto` words), JobSpec messages; spec errors naming the field; job names;
  3. a daemon holding its queue (scheduler.hold): server_info, health, validate_only, estimate,
     create from a dict, YAML text, a path and a JobSpec, typed errors naming the field
     (InvalidArgument, PermissionDenied, AlreadyExists, NotFound, FailedPrecondition), the same
     request_id giving the same job, list over pages of 3 with state and label filters,
     pause/resume/cancel/delete, wait on a cancelled job;
  4. events(follow=True) across a restart: the daemon is stopped (SIGTERM) while the job is
     QUEUED and started again on the same data dir and port; the stream reconnects by itself and
     yields every event once, 1..n, ending SUCCEEDED; a create made while the daemon was down
     is retried (same request_id) until it answers; wait, checkpoints after success, and
     JobFailed (a bad dataset line found in the VALIDATING state, reason BAD_DATA);
  5. AsyncClient: create, events, wait, list, checkpoints, typed errors;
  6. a daemon with --token-file (and its Unix socket): the token, from the argument or
     $OOMB_TOKEN, and Unauthenticated for a wrong or missing one;
  7. a daemon with mTLS (certificates made with openssl): client certificate accepted (the job's
     creator is the certificate's), refused without one;
  8. projects (issue 53): a daemon with a Kubernetes static token file of two teams (alice: nlp,
     bob: vision; carol: both; root: oomb:admins): whoami, create into the caller's project, a job
     of another team NotFound for get/cancel/update by every spelling of its name, a project of
     another team PermissionDenied as a parent (create, list, estimate), list of one project or
     of all (all_projects), an id looked for in the client's project, update (labels, priority,
     display name) recorded with its actor, and the same through AsyncClient.

Prints "python_sdk: ok" at the end. Exit status: 0 ok, 1 a check failed, 77 skipped (no test
data under $OOMB_DATA_DIR or ~/.cache/oomb/data, or the SDK not installed).
"""
import argparse
import asyncio
import glob
import hashlib
import json
import logging
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("OOMB_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "oomb", "data")
TINY = os.path.join(DATA, "tiny", "llama-gqa")

try:
    import grpc
    import oomb
    from oomb import _errors
    from oomb.v1 import job_spec_pb2, jobs_pb2
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"python_sdk: skipped: {e} (scripts/setup.sh installs the SDK)")
    sys.exit(77)


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def expect_error(cls, fn, what):
    """fn() must raise `cls`; returns the exception."""
    try:
        fn()
    except cls as e:
        return e
    except Exception as e:  # noqa: BLE001 - reported
        raise Failure(f"{what}: raised {type(e).__name__}: {e}, not {cls.__name__}") from e
    raise Failure(f"{what}: no {cls.__name__} raised")


class Daemon:
    """`oombd serve` on a data dir, TCP on 127.0.0.1 (port 0 the first time, then the same)."""

    def __init__(self, oombd, data_dir, extra=()):
        self.oombd, self.dir, self.extra = oombd, data_dir, list(extra)
        self.proc = None
        self.port = 0
        os.makedirs(data_dir, exist_ok=True)
        self.log = os.path.join(data_dir, "oombd.log")

    def start(self, extra=None):
        if extra is not None:
            self.extra = list(extra)
        port_file = os.path.join(self.dir, "oombd.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        args = [self.oombd, "serve", "--data-dir", self.dir, "--listen", f"127.0.0.1:{self.port}",
                "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"] + self.extra
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            check(self.proc.poll() is None, f"oombd exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    return self
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        raise Failure(f"oombd did not write {port_file}:\n{self.tail()}")

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise Failure(f"oombd did not stop within 90 s of SIGTERM:\n{self.tail()}") from None
        self.proc = None

    def tail(self, lines=30):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"


class LogRecords(logging.Handler):
    """The `oomb` logger's records (retries and reconnections are logged at INFO)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):  # called under the handler's own lock
        self.messages.append(record.getMessage())

    def matching(self, pattern):
        self.acquire()
        try:
            return [m for m in self.messages if re.search(pattern, m)]
        finally:
            self.release()


def write_ids(path, lines, length, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(json.dumps({"input_ids": [rng.randrange(3, 256) for _ in range(length)]}) + "\n")


def tiny_yaml(train, steps, every_steps=1):
    """tests/client/daemon_harness.h TinyJobYaml: LoRA on the tiny model, CPU, milliseconds a step."""
    return (f"display_name: tiny\n"
            f"labels: {{suite: sdk}}\n"
            f"model: {{path: {TINY}, dtype: float32}}\n"
            f"method: {{type: lora, lora: {{rank: 4, alpha: 8, target_modules: [q_proj, k_proj, v_proj, o_proj]}}}}\n"
            f"data: {{train: {train}, max_seq_len: 128, too_long: truncate, packing: false}}\n"
            f"training: {{max_steps: {steps}, learning_rate: 1.0e-3, warmup_steps: 0, lr_schedule: constant, "
            f"seed: 7}}\n"
            f"memory: {{chunk_tokens: 32, page_tokens: 16}}\n"
            f"checkpoint: {{every_steps: {every_steps}, keep_last: 2}}\n"
            f"resources: {{device: cpu, max_retries: 0}}\n")


def tiny_dict(train, steps, every_steps=1, **labels):
    import yaml
    d = yaml.safe_load(tiny_yaml(train, steps, every_steps))
    d["labels"].update(labels)
    return d


def section(name, started):
    print(f"python_sdk: {name} ok ({time.monotonic() - started:.1f} s)", flush=True)


# 1. The build.
def test_build(tmp):
    t = time.monotonic()
    src = os.path.join(ROOT, "client", "python")
    installed = os.path.dirname(oomb.__file__)
    for path in sorted(glob.glob(os.path.join(src, "oomb", "**", "*"), recursive=True)):
        rel = os.path.relpath(path, os.path.join(src, "oomb"))
        if os.path.isdir(path) or "__pycache__" in rel or re.search(r"_pb2(_grpc)?\.pyi?$", rel):
            continue
        other = os.path.join(installed, rel)
        same = os.path.isfile(other) and open(path, "rb").read() == open(other, "rb").read()
        check(same, f"the installed SDK ({installed}) is not client/python's: {rel} differs; run scripts/setup.sh")
    for rel in ("v1/jobs_pb2.py", "v1/jobs_pb2.pyi", "v1/jobs_pb2_grpc.py", "v1/health_pb2_grpc.py", "py.typed"):
        check(os.path.isfile(os.path.join(installed, rel)), f"the installed SDK lacks oomb/{rel}")
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(oomb VERSION ([0-9.]+)", f.read()).group(1)
    check(oomb.__version__ == cmake_version, f"SDK version {oomb.__version__}, the daemon's {cmake_version}")

    # A copy, so that the in-tree build leaves the working tree alone.
    copy = os.path.join(tmp, "build")
    shutil.copytree(src, os.path.join(copy, "client", "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*_pb2*.py*"))
    shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(copy, "proto"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        os.path.join(copy, "dist"), os.path.join(copy, "client", "python")],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"pip wheel failed:\n{r.stdout}{r.stderr}")
    wheels = glob.glob(os.path.join(copy, "dist", "oomb-*.whl"))
    check(len(wheels) == 1, f"wheels: {wheels}")
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for rel in ("rules_pb2.py", "job_spec_pb2.py", "jobs_pb2.py", "jobs_pb2_grpc.py", "health_pb2.py",
                "health_pb2_grpc.py", "jobs_pb2.pyi", "job_spec_pb2.pyi"):
        check(f"oomb/v1/{rel}" in names, f"the wheel lacks oomb/v1/{rel}: {sorted(names)}")
    check("oomb/py.typed" in names, "the wheel lacks py.typed")
    generated = glob.glob(os.path.join(copy, "client", "python", "oomb", "v1", "*_pb2*"))
    check(not generated, f"the build wrote generated modules into the sources: {generated}")
    metadata = zipfile.ZipFile(wheels[0]).read(next(n for n in names if n.endswith("METADATA"))).decode()
    for req in ("grpcio", "protobuf", "pyyaml"):
        check(re.search(rf"^Requires-Dist: {req}\b", metadata, re.M), f"the wheel does not require {req}")
    check("Requires-Dist: grpcio-tools" not in metadata, "grpcio-tools is a runtime requirement")
    section("build (protoc at build time, into the wheel)", t)


# 2. Without a daemon.
def test_offline(tmp):
    t = time.monotonic()
    d = os.path.join(tmp, "specs")
    os.makedirs(os.path.join(d, "data"))
    path = os.path.join(d, "job.yaml")
    with open(path, "w") as f:
        f.write("model: {path: models/m, dtype: float32}\n"
                "method: {type: lora, lora: {init_adapter: ../adapters/a}}\n"
                "data: {train: data/t.jsonl, validation: /abs/v.jsonl, max_seq_len: 128}\n"
                "memory: {chunk_tokens: auto, page_tokens: 16}\n"
                "checkpoint: {dir: out}\n"
                "evaluation: {suites: [needle], haystack: book.txt}\n"
                "labels: {version: 2}\n")
    for form in (path, pathlib.Path(path)):
        s = oomb.load_spec(form)
        check(s.model.path == os.path.join(d, "models", "m"), f"model.path {s.model.path}")
        check(s.data.train == os.path.join(d, "data", "t.jsonl"), f"data.train {s.data.train}")
        check(s.data.validation == "/abs/v.jsonl", f"data.validation {s.data.validation}")
        check(s.checkpoint.dir == os.path.join(d, "out"), f"checkpoint.dir {s.checkpoint.dir}")
        check(s.method.lora.init_adapter == os.path.join(tmp, "adapters", "a"), s.method.lora.init_adapter)
        check(s.evaluation.haystack == os.path.join(d, "book.txt"), s.evaluation.haystack)
        check(s.memory.HasField("chunk_tokens") and s.memory.chunk_tokens == 0, "chunk_tokens: auto is not 0")
        check(s.model.dtype == job_spec_pb2.ModelSpec.float32 and s.labels["version"] == "2", str(s))
    # RULER's tasks by RULER's names, as the daemon reads them (evaluation.ruler).
    ruler = oomb.load_spec("model: {path: /m}\ndata: {train: /t}\nevaluation: {suites: [ruler], lengths: [4096, 8192],"
                           " ruler: {tasks: [niah_single_1, vt, fwe], samples: 5, threshold: 80}}\n").evaluation
    check(list(ruler.suites) == [job_spec_pb2.Evaluation.ruler]
          and list(ruler.ruler.tasks) == [job_spec_pb2.Evaluation.niah_single_1, job_spec_pb2.Evaluation.vt,
                                          job_spec_pb2.Evaluation.fwe]
          and ruler.ruler.samples == 5 and ruler.ruler.threshold == 80, str(ruler))
    text = oomb.load_spec("model: {path: models/m}\ndata: {train: t.jsonl}\n")
    check(text.model.path == "models/m" and text.data.train == "t.jsonl", "YAML text: paths are sent as they are")
    as_dict = oomb.load_spec({"model": {"path": "/m"}, "training": {"epochs": 2, "learning_rate": 1e-8},
                              "resources": None})
    check(as_dict.training.epochs == 2 and not as_dict.HasField("resources"), str(as_dict))
    check(oomb.load_spec(as_dict) == as_dict, "a JobSpec is not taken as it is")
    for bad, field in (({"data": {"trian": "x"}}, "spec.data.trian"),
                       ({"data": {"max_seq_len": "many"}}, "spec.data.max_seq_len"),
                       ({"model": {"dtype": "float16"}}, "spec.model.dtype"),
                       ({"training": {"max_steps": 1, "epochs": 2}}, "spec.training.epochs"),
                       ({"method": {"lora": {"target_modules": "q_proj"}}}, "spec.method.lora.target_modules"),
                       ({"model": "x"}, "spec.model")):
        e = expect_error(oomb.InvalidArgument, lambda bad=bad: oomb.load_spec(bad), f"spec {bad}")
        check(e.field == field and e.code == grpc.StatusCode.INVALID_ARGUMENT, f"{bad}: field {e.field}: {e}")
    expect_error(oomb.InvalidArgument, lambda: oomb.load_spec("a: 1\na: 2\n"), "a duplicate key")
    expect_error(FileNotFoundError, lambda: oomb.load_spec(os.path.join(d, "missing.yaml")), "a missing file")
    check(oomb.job_name("abc") == "jobs/abc" and oomb.job_name("jobs/abc") == "jobs/abc", "job_name")
    check(oomb.job_name("projects/p/jobs/abc") == "projects/p/jobs/abc", "a name is opaque")
    check(oomb.job_name("abc", "nlp") == oomb.job_name("abc", "projects/nlp") == "projects/nlp/jobs/abc",
          "job_name with a project")
    check(oomb.job_name("jobs/abc", "nlp") == "jobs/abc", "a name is opaque, whatever the project")
    check(oomb.project_name("nlp") == oomb.project_name("projects/nlp") == "projects/nlp", "project_name")
    expect_error(ValueError, lambda: oomb.job_name("abc", "a/b"), "a bad project")
    check(_errors.leading_field("spec: data.train: /x.jsonl:3: bad") == "spec.data.train", "leading_field")
    check(_errors.leading_field("invalid bearer token") is None, "leading_field of a sentence")
    check(oomb.JobState.parse("queued") == oomb.JobState.QUEUED == jobs_pb2.Job.QUEUED, "JobState")
    check(str(oomb.JobState.SUCCEEDED) == "SUCCEEDED" and oomb.JobState.SUCCEEDED.terminal, "JobState.terminal")
    check({s.name: s.value for s in oomb.JobState} ==
          {v.name: v.number for v in jobs_pb2.Job.State.DESCRIPTOR.values}, "JobState differs from Job.State")
    policy = oomb.RetryPolicy()
    check(all(0 < policy.delay(n) <= policy.max_backoff * 1.2 for n in range(12)), "backoff out of bounds")
    os.environ["OOMB_ENDPOINT"] = "unix:/nonexistent.sock"
    check(oomb.Client().endpoint == "unix:/nonexistent.sock", "OOMB_ENDPOINT is not read")
    del os.environ["OOMB_ENDPOINT"]
    check(oomb.Client().endpoint == "127.0.0.1:7070", "the default endpoint")
    check(oomb.Client().project is None, "a project without OOMB_PROJECT")
    os.environ["OOMB_PROJECT"] = "nlp"
    try:
        check(oomb.Client().project == "nlp" and oomb.AsyncClient().project == "nlp", "OOMB_PROJECT is not read")
        check(oomb.Client(project="projects/vision").project == "vision", "the argument over OOMB_PROJECT")
        check(oomb.Client(project="").project is None, 'project="" over OOMB_PROJECT')
    finally:
        del os.environ["OOMB_PROJECT"]
    offline = oomb.Client(project="nlp")
    expect_error(ValueError, lambda: offline.jobs.list(project="vision", all_projects=True), "project and all")
    expect_error(ValueError, lambda: offline.jobs.update("abc"), "update without a field")
    section("offline (specs, names, errors)", t)


# 3. A daemon holding its queue.
def test_held(daemon, tmp, train, main_yaml):
    t = time.monotonic()
    os.environ["OOMB_ENDPOINT"] = daemon.endpoint
    client = oomb.Client()
    del os.environ["OOMB_ENDPOINT"]
    check(client.endpoint == daemon.endpoint, "OOMB_ENDPOINT")
    info = client.server_info()
    check(info.version and not info.draining and any(d.name == "cpu" for d in info.devices), str(info))
    check(client.health() == "SERVING", "health")

    spec = tiny_dict(train, 2)
    checked = client.jobs.create(spec, validate_only=True)
    check(checked.name == "" and checked.spec.training.max_steps == 2 and checked.spec.memory.chunk_tokens == 32,
          f"validate_only: {checked.proto}")
    check(checked.spec.training.adam.beta1 > 0, "validate_only did not return the effective spec (defaults)")
    checked = client.jobs.create(spec, job_id="sdk-checked", validate_only=True)
    check(checked.id == "sdk-checked", f"validate_only with job_id: {checked.name}")
    # A client built before evaluation.suites became an enum sends the suites as strings in field 1
    # (now reserved): CreateJob reads them as the enum (server/legacy_fields.h).
    legacy = oomb.load_spec(spec)
    legacy.evaluation.MergeFromString(b"\x0a\x07passkey")  # field 1, length-delimited: "passkey"
    check(not legacy.evaluation.suites, "the old field parsed as the new one")
    checked = client.jobs.create(legacy, validate_only=True)
    check(list(checked.spec.evaluation.suites) == [job_spec_pb2.Evaluation.passkey],
          f"the old suites field was not read: {checked.spec.evaluation}")
    expect_error(oomb.NotFound, lambda: client.jobs.get("sdk-checked"), "validate_only stored a job")
    check(list(client.jobs.list()) == [], "validate_only stored a job")

    plan = client.jobs.estimate(spec)
    check(plan.fits and plan.seq_len == 128 and plan.device == "cpu", f"estimate: {plan}")

    e = expect_error(oomb.InvalidArgument, lambda: client.jobs.create(dict(spec, training={"learning_rate": -1})),
                     "a negative learning rate")
    check(e.field == "spec.training.learning_rate" and "must be" in e.message, f"field {e.field}: {e.message}")
    e = expect_error(oomb.InvalidArgument, lambda: client.jobs.create(spec, job_id="Bad_Id"), "a bad job_id")
    check(e.field == "job_id", f"field {e.field}: {e.message}")
    e = expect_error(oomb.PermissionDenied,
                     lambda: client.jobs.create(dict(spec, data=dict(spec["data"], train="/etc/shadow"))),
                     "a path outside the allowed roots")
    check(e.field == "spec.data.train", f"field {e.field}: {e.message}")
    e = expect_error(oomb.InvalidArgument, lambda: client.jobs.create({"data": {"trian": train}}), "an unknown key")
    check(e.field == "spec.data.trian", f"field {e.field}")
    e = expect_error(oomb.NotFound, lambda: client.jobs.get("no-such-job"), "a missing job")
    check(e.code == grpc.StatusCode.NOT_FOUND and isinstance(e.__cause__, grpc.RpcError), repr(e))

    # create: a path (relative paths against the file's directory), YAML text, a dict, a JobSpec.
    main = client.jobs.create(main_yaml, job_id="sdk-main")
    check(main.id == "sdk-main" and main.name.endswith("jobs/sdk-main"), main.name)
    check(main.spec.data.train == train, f"data.train {main.spec.data.train}: not resolved against the file")
    check(main.state == oomb.JobState.QUEUED and isinstance(main.queue_position, int), f"{main.state}")
    with open(main_yaml) as f:
        text = f.read().replace("train: ids.jsonl", f"train: {train}")
    from_text = client.jobs.create(text, job_id="sdk-text")
    from_dict = client.jobs.create(tiny_dict(train, 4), job_id="sdk-dict")
    from_proto = client.jobs.create(oomb.load_spec(spec))
    check(from_text.spec == from_dict.spec == main.spec, "the same spec read from a path, text and a dict differs")
    check(from_proto.id and from_proto.spec.model.path == TINY, from_proto.name)
    e = expect_error(oomb.AlreadyExists, lambda: client.jobs.create(spec, job_id="sdk-main"), "a taken job_id")
    check(e.code == grpc.StatusCode.ALREADY_EXISTS, repr(e))
    first = client.jobs.create(spec, request_id="sdk-request-1")
    again = client.jobs.create(spec, request_id="sdk-request-1")
    check(first.name == again.name, f"the same request_id made {first.name} and {again.name}")

    # list: every page (3 jobs a page), newest first, filters.
    paged = [client.jobs.create(tiny_dict(train, 2, batch="page"), job_id=f"sdk-page-{i}") for i in range(7)]
    calls = []
    list_jobs = client.stub.ListJobs
    client.stub.ListJobs = lambda *a, **k: (calls.append(1), list_jobs(*a, **k))[1]
    listed = list(client.jobs.list(labels={"batch": "page"}, page_size=3))
    client.stub.ListJobs = list_jobs
    check([j.name for j in listed] == [j.name for j in reversed(paged)], f"list: {[j.name for j in listed]}")
    check(len(calls) == 3, f"{len(calls)} ListJobs calls for 7 jobs in pages of 3")
    made = {j.name for j in [main, from_text, from_dict, from_proto, first] + paged}  # names: opaque
    everything = [j.name for j in client.jobs.list(page_size=2)]
    check(len(everything) == len(made) == 12 and set(everything) == made, f"list of every job: {everything}")

    # pause / resume / cancel / delete.
    p = paged[0].pause()
    check(p.state == oomb.JobState.PAUSED and paged[0].state == oomb.JobState.PAUSED, f"pause: {p.state}")
    check([j.name for j in client.jobs.list(states=["PAUSED"])] == [p.name], "list(states=[PAUSED])")
    check(client.jobs.resume(p.name).state == oomb.JobState.QUEUED, "resume")
    expect_error(oomb.FailedPrecondition, lambda: client.jobs.resume(p.name), "resume of a QUEUED job")
    expect_error(oomb.FailedPrecondition, lambda: client.jobs.delete(p.name), "delete of a QUEUED job")
    c = client.jobs.cancel("sdk-page-1")
    check(c.state == oomb.JobState.CANCELLED, f"cancel: {c.state}")
    e = expect_error(oomb.JobCancelled, lambda: c.wait(timeout=10), "wait on a cancelled job")
    check(e.job.name == c.name, repr(e))
    check(c.wait(raise_on_failure=False).state == oomb.JobState.CANCELLED, "wait(raise_on_failure=False)")
    expect_error(oomb.FailedPrecondition, lambda: client.jobs.cancel(c.name), "cancel of a cancelled job")
    c.delete()
    expect_error(oomb.NotFound, lambda: client.jobs.get(c.name), "get of a deleted job")
    # Nothing but sdk-main may run once the queue is released.
    for j in client.jobs.list(states=[oomb.JobState.QUEUED, "PAUSED", "VALIDATING"]):
        if j.name != main.name:
            j.cancel()
    left = [j.name for j in client.jobs.list() if not j.done]
    check(left == [main.name], f"jobs left: {left}")
    client.close()
    section("held queue (create, errors, list, pause/resume/cancel/delete)", t)


# 4. events(follow=True) across a restart, wait, checkpoints, JobFailed.
def test_restart(daemon, tmp, records):
    t = time.monotonic()
    # A generous policy: the create made while the daemon is down waits for it.
    client = oomb.Client(endpoint=daemon.endpoint,
                         retry=oomb.RetryPolicy(max_attempts=12, initial_backoff=0.2, max_backoff=2.0))
    main = client.jobs.get("sdk-main")
    events, errors, first = [], [], threading.Event()

    def follow():
        try:
            for e in main.events(reconnect_timeout=60):
                events.append(e)
                first.set()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            first.set()

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    check(first.wait(30) and not errors, f"no first event: {errors}")
    stopped = time.monotonic()
    daemon.stop()  # SIGTERM: the stream ends UNAVAILABLE (draining) or the connection drops
    created = {}

    def create_while_down():
        try:
            created["job"] = client.jobs.create(tiny_dict(main.spec.data.train, 1), job_id="sdk-retry",
                                                request_id="sdk-request-restart")
        except Exception as e:  # noqa: BLE001 - reported below
            created["error"] = e

    creator = threading.Thread(target=create_while_down, daemon=True)
    creator.start()
    time.sleep(1.0)  # both the watcher and the creator find no daemon for a while
    daemon.start(extra=["--set", "scheduler.validate_inline_max_bytes=0"])  # the queue released
    print(f"python_sdk: daemon restarted in {time.monotonic() - stopped:.1f} s", flush=True)
    creator.join(60)
    check("job" in created, f"create during the restart: {created.get('error')}")
    check(created["job"].id == "sdk-retry", created["job"].name)
    check(records.matching(r"^CreateJob: UNAVAILABLE; retry"), f"CreateJob was not retried: {records.messages}")
    again = client.jobs.create(tiny_dict(main.spec.data.train, 1), request_id="sdk-request-restart")
    check(again.name == created["job"].name, f"the same request_id after the restart made {again.name}")
    try:
        again.cancel()
    except oomb.FailedPrecondition:
        pass  # it may have run already

    final = main.wait(timeout=120, poll=0.2)
    check(final is main and main.state == oomb.JobState.SUCCEEDED and main.progress.step == 4,
          f"wait: {main.state} step {main.progress.step}")
    watcher.join(60)
    check(not watcher.is_alive(), "events(follow=True) did not end with the job")
    check(not errors, f"events(follow=True) raised: {errors}")
    reconnects = records.matching(r"^watch \S*jobs/sdk-main: .*reconnecting after sequence")
    check(reconnects, f"the watch did not reconnect: {records.messages}")
    print(f"python_sdk: {len(reconnects)} reconnections, the first: {reconnects[0][:160]}", flush=True)
    seqs = [e.sequence for e in events]
    check(seqs == list(range(1, len(seqs) + 1)), f"sequences across the restart: {seqs}")
    stored = list(main.events(follow=False))
    check([(e.sequence, e.type, e.state) for e in stored] == [(e.sequence, e.type, e.state) for e in events],
          "the followed events differ from the stored ones")
    check(events[-1].type == jobs_pb2.JobEvent.STATE_CHANGED and events[-1].state == jobs_pb2.Job.SUCCEEDED,
          f"the last event: {events[-1]}")
    states = [jobs_pb2.Job.State.Name(e.state) for e in events if e.type == jobs_pb2.JobEvent.STATE_CHANGED]
    check(states[0] == "QUEUED" and states[-2:] == ["RUNNING", "SUCCEEDED"], f"states {states}")
    check(list(main.events(after=len(seqs) - 2)) == events[-2:], "events(after=n-2) is not the last two")
    reach = [e.message for e in stored if e.type == jobs_pb2.JobEvent.LOG and e.message.startswith("gradients at ")]
    check(reach and "reached every trainable module: self_attn.q_proj" in reach[0], f"the gradients' reach: {reach}")
    check(main.end_time is not None and main.start_time is not None and main.create_time <= main.end_time, "times")

    cps = main.checkpoints()
    final_cps = [c for c in cps if c.final]
    check(len(final_cps) == 1 and final_cps[0].step == 4 and os.path.isdir(final_cps[0].path), f"checkpoints {cps}")
    check(os.path.isfile(os.path.join(final_cps[0].path, "adapter_model.safetensors")), "no adapter in final/")
    check(final_cps[0].path in final_cps[0].load_code and "PeftModel" in final_cps[0].load_code,
          final_cps[0].load_code)
    check(all(isinstance(c, oomb.Checkpoint) and c.bytes > 0 for c in cps), str(cps))
    check(client.jobs.checkpoints("sdk-main") == cps, "jobs.checkpoints(id) differs from job.checkpoints()")

    # A bad line found in the VALIDATING state (every dataset is scanned there now).
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"input_ids": [5, 6, 7]}\n{"input_ids": [5, 999]}\n')
    failing = client.jobs.create(tiny_dict(bad, 1), job_id="sdk-bad")
    e = expect_error(oomb.JobFailed, lambda: failing.wait(timeout=60, poll=0.2), "wait on a failing job")
    check(e.reason == "BAD_DATA" and "bad.jsonl:2" in e.message and e.job.state == oomb.JobState.FAILED,
          f"JobFailed: reason {e.reason}: {e.message}")
    check(failing.error is not None and failing.error.reason == "BAD_DATA", str(failing.error))
    expect_error(oomb.WaitTimeout, lambda: client.jobs.create(tiny_dict(main.spec.data.train, 1000, 0))
                 .wait(timeout=0.3, poll=0.1), "wait with a timeout")
    for j in client.jobs.list(states=["VALIDATING", "QUEUED", "RUNNING"]):
        j.cancel()
    client.close()
    section("restart (events reconnect without duplicates, create retried, wait, checkpoints, JobFailed)", t)


# 5. AsyncClient.
def test_async(daemon, train):
    t = time.monotonic()

    async def transfers(client):
        # Data in, models out: the same dataset record and checkpoint files as the sync client's.
        data = await client.datasets.upload(train, dataset_id="async-ids")
        check(data.spec_name == "datasets/async-ids" and data.records == 4, f"async upload {data}")
        with open(train, "rb") as f:
            check(data.sha256 == hashlib.sha256(f.read()).hexdigest(), "async upload's SHA-256")
        check((await client.datasets.get("async-ids")) == data, "async get of the dataset")
        check([d.id async for d in client.datasets.list()] == ["async-ids"], "async list of datasets")
        with tempfile.TemporaryDirectory() as d:
            got = await client.jobs.download("sdk-async", os.path.join(d, "async"))
            want = oomb.Client(endpoint=daemon.endpoint).jobs.download("sdk-async", os.path.join(d, "sync"))
            names = sorted(os.listdir(got))
            check("adapter_model.safetensors" in names and names == sorted(os.listdir(want)), f"async download {names}")
            for n in names:
                with open(os.path.join(got, n), "rb") as a, open(os.path.join(want, n), "rb") as b:
                    check(a.read() == b.read(), f"async download: {n} differs from the sync client's")
            check(any(c.step == 1 and not c.final for c in await client.jobs.checkpoints("sdk-async")),
                  "no checkpoint of step 1 to download")
            step1 = await (await client.jobs.get("sdk-async")).download(os.path.join(d, "step1"), step=1)
            check("adapter_model.safetensors" in os.listdir(step1), f"async download of step 1 {os.listdir(step1)}")
        await client.datasets.delete("async-ids")
        try:
            await client.datasets.get("async-ids")
            check(False, "async get of a deleted dataset")
        except oomb.NotFound:
            pass

    async def run():
        async with oomb.AsyncClient(endpoint=daemon.endpoint) as client:
            check(await client.health() == "SERVING", "async health")
            check((await client.server_info()).version, "async server_info")
            job = await client.jobs.create(tiny_dict(train, 2), job_id="sdk-async")
            events = [e async for e in job.events()]
            check(events and events[-1].state == jobs_pb2.Job.SUCCEEDED, f"async events end {events[-1:]}")
            check([e.sequence for e in events] == list(range(1, len(events) + 1)), "async event sequences")
            check(job.state == oomb.JobState.SUCCEEDED, f"the snapshot did not update the job: {job.state}")
            done = await client.jobs.wait("sdk-async", timeout=30, poll=0.1)
            check(done.state == oomb.JobState.SUCCEEDED and done.progress.step == 2, f"async wait {done}")
            # A mixture of experts with the router's auxiliary loss (model.router_aux_loss_coef) and
            # LoRA on its expert banks: the progress carries the loss (in (0, E top_k] = (0, 8]), the
            # gradients reached every expert bank.
            moe = tiny_dict(train, 1)
            moe["model"] = {"path": os.path.join(DATA, "tiny", "qwen3-moe"), "dtype": "float32",
                            "router_aux_loss_coef": 0.5}
            moe["method"]["lora"]["target_parameters"] = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
            await client.jobs.create(moe, job_id="sdk-moe")
            trained = await client.jobs.wait("sdk-moe", timeout=60, poll=0.1)
            check(trained.state == oomb.JobState.SUCCEEDED and 0 < trained.progress.router_aux_loss <= 8,
                  f"the mixture of experts' job: {trained.state}, progress {trained.progress}")
            reach = [e.message async for e in trained.events(follow=False)
                     if e.type == jobs_pb2.JobEvent.LOG and e.message.startswith("gradients at ")]
            check(reach and "mlp.experts.down_proj 2/2 (experts" in reach[0], f"the experts' reach: {reach}")
            stored = [e async for e in job.events(follow=False)]
            check(stored == events, "async events: stored and followed differ")
            names = [j.name async for j in client.jobs.list(page_size=2)]
            check(job.name in names and len(names) == len(set(names)) > 4, f"async list {names}")
            cps = await job.checkpoints()
            check(any(c.final and c.step == 2 for c in cps), f"async checkpoints {cps}")
            await transfers(client)
            try:
                await client.jobs.get("no-such-job")
                check(False, "async get of a missing job")
            except oomb.NotFound:
                pass
            try:
                await job.cancel()
                check(False, "async cancel of a finished job")
            except oomb.FailedPrecondition:
                pass
            await job.delete()
            try:
                await job.refresh()
                check(False, "async refresh of a deleted job")
            except oomb.NotFound:
                pass

    asyncio.run(run())
    section("AsyncClient", t)


# 6. Token.
def test_token(oombd, tmp):
    t = time.monotonic()
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write("s3cret-token\n")
    os.chmod(token_file, 0o600)
    daemon = Daemon(oombd, os.path.join(tmp, "data-token"),
                    ["--token-file", token_file, "--unix-socket", "--set", "scheduler.hold=true"]).start()
    try:
        with oomb.Client(endpoint=daemon.endpoint, token="s3cret-token") as client:
            check(client.server_info().version, "server_info with the token")
            check(list(client.jobs.list()) == [], "list with the token")
        none = oomb.RetryPolicy.none()
        for token in ("wrong", None):
            with oomb.Client(endpoint=daemon.endpoint, token=token, retry=none) as client:
                e = expect_error(oomb.Unauthenticated, client.server_info, f"token {token}")
                check(e.code == grpc.StatusCode.UNAUTHENTICATED, repr(e))
                expect_error(oomb.Unauthenticated, lambda: list(client.jobs.list()), f"list, token {token}")
                expect_error(oomb.Unauthenticated, lambda: next(client.jobs.events("x")), f"events, token {token}")
                check(client.health() == "SERVING", "health needs no token")
        os.environ["OOMB_TOKEN"] = "s3cret-token"
        try:
            with oomb.Client(endpoint=f"unix:{daemon.dir}/oombd.sock") as client:
                check(client.server_info().version, "OOMB_TOKEN over the Unix socket")
        finally:
            del os.environ["OOMB_TOKEN"]
    finally:
        daemon.stop()
    section("token (argument, OOMB_TOKEN, Unix socket, Unauthenticated)", t)


# 7. mTLS.
def test_mtls(oombd, tmp, train):
    t = time.monotonic()
    certs = os.path.join(tmp, "certs")
    os.makedirs(certs)
    cmd = ("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=oomb-test-ca"
           " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1"
           " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext"
           " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2"
           " -extfile san.ext"
           " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr"
           " -subj /CN=oomb-client/O=oomb:admins"  # a caller of every project (the O entries: its groups)
           " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2")
    r = subprocess.run(cmd, shell=True, cwd=certs, capture_output=True, text=True)
    check(r.returncode == 0, f"openssl: {r.stderr}")
    c = lambda name: os.path.join(certs, name)  # noqa: E731
    daemon = Daemon(oombd, os.path.join(tmp, "data-tls"),
                    ["--set", f"tls.cert_file={c('server.pem')}", "--set", f"tls.key_file={c('server.key')}",
                     "--set", f"tls.client_ca_file={c('ca.pem')}", "--set", "scheduler.hold=true"]).start()
    try:
        with oomb.Client(endpoint=daemon.endpoint, ca=c("ca.pem"), cert=c("client.pem"), key=c("client.key")) as cl:
            check(cl.server_info().version, "server_info over mTLS")
            job = cl.jobs.create(tiny_dict(train, 1), job_id="sdk-tls")
            check("oomb-client" in job.creator, f"creator {job.creator}: not the certificate's")
            job.cancel()
        with open(c("ca.pem"), "rb") as f:
            ca = f.read()
        with oomb.Client(endpoint=daemon.endpoint, ca=ca, cert=pathlib.Path(c("client.pem")),
                         key=pathlib.Path(c("client.key"))) as cl:
            check(cl.jobs.get("sdk-tls").state == oomb.JobState.CANCELLED, "PEM bytes and paths")
        none = oomb.RetryPolicy.none()
        for kwargs in ({"ca": ca}, {}):  # no client certificate; plaintext
            with oomb.Client(endpoint=daemon.endpoint, retry=none, timeout=10, **kwargs) as cl:
                expect_error(oomb.OombError, cl.server_info, f"mTLS daemon, client {list(kwargs) or 'plaintext'}")
    finally:
        daemon.stop()
    section("mTLS (client certificate required)", t)


# 8. Projects: teams from a Kubernetes static token file.
def test_projects(oombd, tmp, train):
    t = time.monotonic()
    tokens = os.path.join(tmp, "tokens.csv")
    with open(tokens, "w") as f:
        f.write('# token,user,uid,"groups"\n'
                'alice-token,alice,1001,"nlp"\n'
                'bob-token,bob,1002,"vision"\n'
                'carol-token,carol,1003,"nlp,vision"\n'
                'root-token,root,0,"oomb:admins"\n')
    os.chmod(tokens, 0o600)
    daemon = Daemon(oombd, os.path.join(tmp, "data-projects"),
                    ["--set", f"auth.tokens_file={tokens}", "--set", "scheduler.hold=true"]).start()
    clients = []

    def as_user(user, **kwargs):
        c = oomb.Client(endpoint=daemon.endpoint, token=f"{user}-token", retry=oomb.RetryPolicy.none(), **kwargs)
        clients.append(c)
        return c

    try:
        alice, bob, carol, root = (as_user(u) for u in ("alice", "bob", "carol", "root"))
        me = alice.whoami()
        check(isinstance(me, oomb.Caller) and me.user == "alice" and me.uid == "1001" and me.groups == ["nlp"]
              and me.authenticated_by == "token" and not me.admin and me.projects == ["projects/nlp"]
              and me.project_ids == ["nlp"], f"alice: {me}")
        check(bob.whoami().projects == ["projects/vision"], f"bob: {bob.whoami()}")
        check(carol.whoami().projects == ["projects/nlp", "projects/vision"], f"carol: {carol.whoami()}")
        check(root.whoami().admin and root.whoami().user == "root", f"root: {root.whoami()}")

        # Each creates in its only project without naming it.
        spec = tiny_dict(train, 2)
        job = alice.jobs.create(spec, job_id="sdk-nlp")
        check(job.name == "projects/nlp/jobs/sdk-nlp" and job.creator == "alice", f"{job.name} by {job.creator}")
        check(alice.jobs.create(spec, job_id="sdk-nlp-2", project="nlp").name == "projects/nlp/jobs/sdk-nlp-2",
              "create(project=nlp)")
        check(bob.jobs.create(spec, job_id="sdk-vision").name == "projects/vision/jobs/sdk-vision", "bob's job")
        e = expect_error(oomb.InvalidArgument, lambda: carol.jobs.create(spec), "carol's create without a project")
        check(e.field == "parent" and "projects/nlp, projects/vision" in e.message, f"field {e.field}: {e.message}")

        # bob, of another team: alice's job does not exist for him, by any spelling of its name.
        for name in ("sdk-nlp", "jobs/sdk-nlp", "projects/nlp/jobs/sdk-nlp"):
            expect_error(oomb.NotFound, lambda name=name: bob.jobs.get(name), f"bob: get {name}")
            expect_error(oomb.NotFound, lambda name=name: bob.jobs.cancel(name), f"bob: cancel {name}")
            expect_error(oomb.NotFound, lambda name=name: bob.jobs.update(name, priority=5), f"bob: update {name}")
        for what, call in (("create", lambda: bob.jobs.create(spec, project="nlp")),
                           ("list", lambda: list(bob.jobs.list(project="nlp"))),
                           ("estimate", lambda: bob.jobs.estimate(spec, project="projects/nlp")),
                           ("list, the client's project", lambda: list(as_user("bob", project="nlp").jobs.list()))):
            e = expect_error(oomb.PermissionDenied, call, f"bob: {what} in nlp")
            check("bob may not act in project nlp" in e.message, f"bob: {what}: {e.message}")
        check(alice.jobs.get("sdk-nlp").state == oomb.JobState.QUEUED, "bob changed alice's job")

        # Lists: one project, the client's, or all of the caller's.
        names = lambda jobs: sorted(j.name for j in jobs)  # noqa: E731
        nlp = ["projects/nlp/jobs/sdk-nlp", "projects/nlp/jobs/sdk-nlp-2"]
        check(names(alice.jobs.list()) == nlp, "alice's list")
        check(names(bob.jobs.list(all_projects=True)) == ["projects/vision/jobs/sdk-vision"], "bob's list")
        both = nlp + ["projects/vision/jobs/sdk-vision"]
        check(names(carol.jobs.list(all_projects=True)) == both, "carol: list(all_projects=True)")
        check(names(carol.jobs.list(project="vision")) == both[2:], "carol: list(project=vision)")
        carol_vision = as_user("carol", project="vision")
        check(names(carol_vision.jobs.list()) == both[2:], "carol: the client's project")
        check(names(carol_vision.jobs.list(all_projects=True)) == both, "all_projects over the client's project")
        check(names(carol_vision.jobs.list(project="nlp")) == nlp, "the call's project over the client's")
        check(names(root.jobs.list(all_projects=True)) == both, "root's list")
        # An id is looked for in the client's project: carol may see sdk-nlp, but not in vision.
        expect_error(oomb.NotFound, lambda: carol_vision.jobs.get("sdk-nlp"), "sdk-nlp in projects/vision")
        check(carol_vision.jobs.get("projects/nlp/jobs/sdk-nlp").id == "sdk-nlp", "a name whatever the project")
        check(as_user("carol", project="nlp").jobs.get("sdk-nlp").name == job.name, "sdk-nlp in projects/nlp")
        check(carol_vision.jobs.create(spec, job_id="sdk-carol").name == "projects/vision/jobs/sdk-carol",
              "create in the client's project")
        check(carol_vision.jobs.estimate(spec).fits, "estimate in the client's project")

        # update: the fields given, recorded with the actor.
        updated = alice.jobs.update("sdk-nlp", labels={"run": "2"}, priority=7, display_name="renamed")
        check(updated.labels == {"run": "2"} and updated.priority == 7 and updated.display_name == "renamed",
              f"update: {updated.labels} {updated.priority} {updated.display_name}")
        check(job.update(priority=3) is job and job.priority == 3 and job.labels == {"run": "2"}
              and job.display_name == "renamed", f"job.update: {job.proto}")
        check(root.jobs.get(job.name).priority == 3, "the update was not stored")
        events = list(job.events(follow=False))
        updates = [(e.message, e.actor) for e in events if e.message.startswith("updated: ")]
        check(updates == [("updated: labels, priority, spec.display_name", "alice"), ("updated: priority", "alice")],
              f"update events: {updates}")
        check(events[0].actor == "alice", f"the first event's actor: {events[0]}")
        check(all(e.actor != "bob" for e in events), "an event by bob")
        e = expect_error(oomb.InvalidArgument, lambda: job.update(priority=10 ** 7), "a priority out of range")
        check("priority" in (e.field or ""), f"field {e.field}: {e.message}")
        job.cancel()
        expect_error(oomb.FailedPrecondition, lambda: job.update(labels={}), "update of a cancelled job")

        async def run():
            async with oomb.AsyncClient(endpoint=daemon.endpoint, token="carol-token", project="vision") as ac:
                caller = await ac.whoami()
                check(caller.user == "carol" and caller.project_ids == ["nlp", "vision"], f"async whoami {caller}")
                check(sorted([j.name async for j in ac.jobs.list()]) ==
                      ["projects/vision/jobs/sdk-carol", "projects/vision/jobs/sdk-vision"], "async list")
                check(len([j async for j in ac.jobs.list(all_projects=True)]) == 4, "async list(all_projects)")
                made = await ac.jobs.create(spec, job_id="sdk-async-nlp", project="nlp")
                check(made.name == "projects/nlp/jobs/sdk-async-nlp", made.name)
                check((await ac.jobs.estimate(spec, project="nlp")).fits, "async estimate")
                got = await ac.jobs.update("sdk-carol", labels={"team": "vision"})
                check(got.labels == {"team": "vision"} and got.name == "projects/vision/jobs/sdk-carol", f"{got}")
                await made.update(display_name="async")
                check(made.display_name == "async", f"async job.update: {made.proto}")
                try:
                    await ac.jobs.get("sdk-nlp")  # projects/vision/jobs/sdk-nlp
                    check(False, "async get of sdk-nlp in projects/vision")
                except oomb.NotFound:
                    pass
            async with oomb.AsyncClient(endpoint=daemon.endpoint, token="bob-token") as ab:
                try:
                    await ab.jobs.create(spec, project="nlp")
                    check(False, "async create by bob in nlp")
                except oomb.PermissionDenied:
                    pass

        asyncio.run(run())
    finally:
        for c in clients:
            c.close()
        daemon.stop()
    section("projects (tokens file, whoami, NotFound/PermissionDenied across teams, list, update)", t)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("oombd")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(TINY, "config.json")):
        print(f"python_sdk: skipped: no tiny test model under {TINY} (scripts/fetch_test_data.sh)")
        sys.exit(77)
    records = LogRecords()
    logging.getLogger("oomb").addHandler(records)
    logging.getLogger("oomb").setLevel(logging.INFO)
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="oomb_sdk_test_")
    daemons = []
    try:
        test_build(tmp)
        test_offline(tmp)
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        train = os.path.join(work, "ids.jsonl")
        write_ids(train, 4, 120)
        main_yaml = os.path.join(work, "job.yaml")
        with open(main_yaml, "w") as f:
            f.write(tiny_yaml("ids.jsonl", 4))  # a relative path, resolved against work/
        daemon = Daemon(a.oombd, os.path.join(tmp, "data"), ["--set", "scheduler.hold=true"]).start()
        daemons.append(daemon)
        test_held(daemon, tmp, train, main_yaml)
        test_restart(daemon, tmp, records)
        test_async(daemon, train)
        daemon.stop()
        test_token(a.oombd, tmp)
        test_mtls(a.oombd, tmp, train)
        test_projects(a.oombd, tmp, train)
    except Failure as e:
        print(f"python_sdk: FAILED: {e}", file=sys.stderr)
        for d in daemons:
            print(f"--- {d.log}:\n{d.tail()}", file=sys.stderr)
        sys.exit(1)
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"python_sdk: every section passed in {time.monotonic() - started:.1f} s")
    print("python_sdk: ok")


if __name__ == "__main__":
    main()
