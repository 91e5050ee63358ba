#!/usr/bin/env python3
"""Issue 78's gateway findings, performed for real against a real daemon: one client cannot stall
the HTTP gateway (server/http/http_server.h).

Run by ctest as `gateway_stall` (tests/CMakeLists.txt): test_gateway_stall.py OOMBD [--report FILE].
While these are held open at once:
  - 200 slow or idle HTTP clients without a token, from four loopback addresses (127.0.0.2-5):
    headers sent a byte at a time, headers complete with a body that never comes, and connections
    that send nothing;
  - 200 authenticated SSE watch streams of a queued job, from 127.0.0.6-9;
health (GET /healthz, 100 times) and a legitimate client (creating a job, 5 times) from
127.0.0.1 are served. Their latencies are printed (p50, p99, max); the checks are that each
is answered, within 5 s (the gateway before this round stalled for as long as the attack
lasted: 70 s measured), not a latency target, which bench/results measure.
Then the limits themselves: the slow headers are cut at http.header_timeout_seconds though
they keep sending; a stalled JSON body at http.body_timeout_seconds; from one address,
connections past http.max_connections_per_client are closed as they are accepted while
another address is served; the project's stream past http.max_streams_per_project is 429.

Prints "gateway_stall: ok" at the end. Exit status: 0 ok, 1 a check failed.
"""
import argparse
import json
import os
import select
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sdk import TINY, Daemon, Failure, check, write_ids  # noqa: E402

TOKENS = "alice-token,alice,1001,nlp\n"
HEADER_TIMEOUT = 3
BODY_TIMEOUT = 4
PER_CLIENT = 64
STREAMS = 200


def connect(port, source, timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def request(port, method, path, body=None, token=None, source="127.0.0.1"):
    """One HTTP/1.1 request on a fresh connection: (status, body bytes, seconds)."""
    started = time.monotonic()
    s = connect(port, source)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: oomb\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        s.sendall(head.encode() + b"\r\n" + data)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    finally:
        s.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, answer.partition(b"\r\n\r\n")[2], time.monotonic() - started


def closed_by_server(s, within):
    """True when the server closes `s` within `within` seconds."""
    s.settimeout(within)
    try:
        while True:
            if not s.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


class Dribbler(threading.Thread):
    """Sends a request's headers a byte every 0.2 s, never finishing them; records when the
    server closed the connection."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock, self.closed_at, self.stop = sock, None, threading.Event()

    def run(self):
        text = b"POST /v1/projects/nlp/jobs HTTP/1.1\r\nHost: oomb\r\nX-Slow: " + b"a" * 100000
        for b in text:
            if self.stop.is_set():
                return
            try:
                self.sock.send(bytes([b]))
            except OSError:
                self.closed_at = time.monotonic()
                return
            time.sleep(0.2)


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(name, seconds):
    ms = [1000 * x for x in seconds]
    return (f"{name}: n={len(ms)} p50={statistics.median(ms):.1f} ms p99={percentile(ms, 0.99):.1f} ms "
            f"max={max(ms):.1f} ms")


def open_sse(port, source, job):
    s = connect(port, source)
    s.sendall(f"GET /v1/{job}:watch HTTP/1.1\r\nHost: oomb\r\nAuthorization: Bearer alice-token\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        check(chunk, f"watch from {source}: closed after {head!r}")
        head += chunk
    return s, head


def hold_attack(port, job, out):
    """Opens the 200 slow clients and the 200 streams; returns what to close, and the dribblers."""
    held, dribblers = [], []
    for i in range(200):
        s = connect(port, f"127.0.0.{2 + i % 4}")
        kind = i % 3
        if kind == 0:
            d = Dribbler(s)
            d.start()
            dribblers.append(d)
        elif kind == 1:  # complete headers, a body that never comes
            s.sendall(b"POST /v1/projects/nlp/jobs HTTP/1.1\r\nHost: oomb\r\nContent-Length: 1000\r\n\r\n{\"spec\"")
        held.append(s)  # kind 2: nothing at all
    started = time.monotonic()
    for i in range(STREAMS):
        s, head = open_sse(port, f"127.0.0.{6 + i % 4}", job)
        check(head.startswith(b"HTTP/1.1 200"), f"watch {i}: {head[:200]!r}")
        held.append(s)
    out.append(f"opened 200 slow clients and {STREAMS} SSE streams in {time.monotonic() - started:.1f} s")
    return held, dribblers


def served_meanwhile(port, spec, out):
    """Health and a legitimate client from 127.0.0.1 while the attack is held."""
    health = []
    for _ in range(100):
        status, body, seconds = request(port, "GET", "/healthz")
        check(status == 200 and json.loads(body) == {"status": "SERVING"}, f"/healthz: {status} {body[:200]!r}")
        check(seconds < 5, f"/healthz took {seconds:.1f} s under the attack")
        health.append(seconds)
    creates = []
    for i in range(5):
        status, body, seconds = request(port, "POST", f"/v1/projects/nlp/jobs?job_id=legit-{i}", spec, "alice-token")
        check(status == 200, f"a legitimate job creation: {status} {body[:300]!r}")
        check(seconds < 5, f"a legitimate job creation took {seconds:.1f} s under the attack")
        creates.append(seconds)
    out.append(summary("health under attack", health))
    out.append(summary("job creation under attack", creates))


def check_limits(port, held, dribblers, out):
    # The header deadline: the dribblers kept sending, and were cut all the same.
    deadline = time.monotonic() + HEADER_TIMEOUT + 10
    while time.monotonic() < deadline and any(d.closed_at is None for d in dribblers):
        time.sleep(0.2)
    open_dribblers = sum(d.closed_at is None for d in dribblers)
    check(open_dribblers == 0, f"{open_dribblers} of {len(dribblers)} clients sending headers a byte at a time "
                               f"were not cut at the {HEADER_TIMEOUT} s header deadline")
    # The body deadline: headers complete, the body stalled.
    s = connect(port, "127.0.0.20")
    s.sendall(b"POST /v1/projects/nlp/jobs HTTP/1.1\r\nHost: oomb\r\nContent-Length: 100\r\n\r\n{")
    check(closed_by_server(s, BODY_TIMEOUT + 5), f"a stalled body was not cut at the {BODY_TIMEOUT} s body deadline")
    s.close()
    # Connections per client: past the cap, closed as accepted; another address is served.
    mine = [connect(port, "127.0.0.21") for _ in range(PER_CLIENT + 6)]
    time.sleep(0.5)  # well inside the header deadline: only the refused ones are closed yet
    readable, _, _ = select.select(mine, [], [], 0.5)
    refused = sum(closed_by_server(s, 0.1) for s in readable)
    check(refused == len(mine) - PER_CLIENT, f"{refused} of {len(mine)} connections from one address were refused; "
                                             f"its cap is {PER_CLIENT}")
    status, _, _ = request(port, "GET", "/healthz", source="127.0.0.22")
    check(status == 200, f"another address while one is at its cap: {status}")
    for s in mine:
        s.close()
    out.append(f"limits: header deadline cut {len(dribblers)} dribblers, stalled body cut, "
               f"{refused} connections past the per-client cap refused")


def check_stream_cap(port, job):
    s = connect(port, "127.0.0.23")
    s.sendall(f"GET /v1/{job}:watch HTTP/1.1\r\nHost: oomb\r\nAuthorization: Bearer alice-token\r\n\r\n".encode())
    answer = s.recv(4096)
    s.close()
    check(answer.startswith(b"HTTP/1.1 429") and b"http.max_streams_per_project" in answer,
          f"stream {STREAMS + 1} of a project at its cap: {answer[:300]!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("oombd")
    p.add_argument("--report", help="also write the measured lines here")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="oomb_stall_test_")
    daemon = None
    out = []
    try:
        tokens = os.path.join(tmp, "tokens.csv")
        with open(tokens, "w") as f:
            f.write(TOKENS)
        daemon = Daemon(a.oombd, os.path.join(tmp, "data"), [
            "--set", f"auth.tokens_file={tokens}", "--set", "scheduler.hold=true",
            "--set", f"http.header_timeout_seconds={HEADER_TIMEOUT}",
            "--set", f"http.body_timeout_seconds={BODY_TIMEOUT}",
            "--set", f"http.max_connections_per_client={PER_CLIENT}",
            "--set", f"http.max_streams_per_project={STREAMS}"]).start()
        with open(os.path.join(daemon.dir, "oombd.http.port")) as f:
            port = int(f.read().strip())
        train = os.path.join(tmp, "ids.jsonl")
        write_ids(train, 4, 100)
        spec = {"displayName": "legit", "model": {"path": TINY, "dtype": "float32"},
                "method": {"type": "lora", "lora": {"rank": 4, "alpha": 8, "targetModules": ["q_proj"]}},
                "data": {"train": train, "maxSeqLen": 128, "tooLong": "truncate"},
                "training": {"maxSteps": 1}, "resources": {"device": "cpu"}}
        status, body, _ = request(port, "POST", "/v1/projects/nlp/jobs?job_id=watched", spec, "alice-token")
        check(status == 200, f"the watched job: {status} {body[:300]!r}")
        held, dribblers = hold_attack(port, "projects/nlp/jobs/watched", out)
        try:
            served_meanwhile(port, spec, out)
            check_stream_cap(port, "projects/nlp/jobs/watched")
            check_limits(port, held, dribblers, out)
        finally:
            for d in dribblers:
                d.stop.set()
            for s in held:
                s.close()
    except Failure as e:
        print(f"gateway_stall: FAILED: {e}", file=sys.stderr)
        if daemon is not None:
            print(f"--- {daemon.log}:\n{daemon.tail()}", file=sys.stderr)
        sys.exit(1)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for line in out:
        print(f"gateway_stall: {line}")
    if a.report:
        with open(a.report, "w") as f:
            f.write("\n".join(out) + "\n")
    print("gateway_stall: ok")


if __name__ == "__main__":
    main()
