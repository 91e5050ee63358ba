#!/usr/bin/env python3
"""Watchers that stop reading never slow training (issue 7), and catch up without gaps.

Driven by tests/server/daemon_integration_test.cc (DaemonTest.StalledWatchersDoNotHoldBackTraining)
against a running `oombd serve`, through the Python SDK (client/python): submits the given job spec
(JSON), opens --watchers WatchJob
streams on channels with a 1 KiB HTTP/2 stream window (BDP probing off), reads only each
stream's snapshot and then stops reading, so the daemon's writes to them block on flow control.
The job must still reach SUCCEEDED (polled on another channel) within --timeout seconds. Then
every stalled stream is drained: its events must be the job's events 1..n in order, without
gaps, ending with SUCCEEDED — the watcher fell back to the store instead of holding the job.
Exit status: 0 ok, 1 a check failed, 77 grpcio or the SDK missing (the test skips).
"""
import argparse
import json
import sys
import time

try:
    import oomb
    from oomb.v1 import jobs_pb2 as pb
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"grpc_slow_watcher: skipped: {e}")
    sys.exit(77)


def check(cond, msg):
    if not cond:
        print(f"grpc_slow_watcher: FAILED: {msg}", file=sys.stderr)
        sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--spec-json", required=True)
    p.add_argument("--watchers", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    with open(a.spec_json) as f:
        spec = json.load(f)
    control = oomb.Client(endpoint=a.endpoint)
    job = control.jobs.create(spec)

    # Raw streams (the generated stub of an SDK client per channel), so that they can stop reading.
    small_window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
    stalled, clients = [], []
    for _ in range(a.watchers):
        clients.append(oomb.Client(endpoint=a.endpoint, options=small_window))
        call = clients[-1].stub.WatchJob(pb.WatchJobRequest(name=job.name))
        first = next(call)
        check(first.HasField("snapshot"), "the first message is not the snapshot")
        stalled.append(call)  # not read again until the job has ended

    start = time.monotonic()
    try:
        final = job.wait(timeout=a.timeout, poll=0.2, raise_on_failure=False)
    except oomb.WaitTimeout:
        final = job
    check(final.state == oomb.JobState.SUCCEEDED,
          f"job state {final.state} after {time.monotonic() - start:.0f} s with stalled watchers")
    print(f"job SUCCEEDED at step {final.progress.step} in {time.monotonic() - start:.1f} s "
          f"with {a.watchers} stalled watchers")

    events = list(job.events(follow=False))  # ListJobEvents, every page
    check(len(events) > 200, f"only {len(events)} events: make the job longer so the window fills")
    for i, call in enumerate(stalled):
        got = [m.event for m in call if m.HasField("event")]
        seqs = [e.sequence for e in got]
        check(seqs == list(range(1, len(events) + 1)), f"watcher {i}: sequences {seqs[:5]}...{seqs[-5:]} "
                                                       f"(want 1..{len(events)})")
        check(got[-1].state == pb.Job.SUCCEEDED, f"watcher {i}: last event is not SUCCEEDED")
    print(f"grpc_slow_watcher: {a.watchers} stalled watchers caught up on {len(events)} events; ok")


if __name__ == "__main__":
    main()
