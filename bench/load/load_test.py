#!/usr/bin/env python3
"""A bounded load generator for oombd (issue 11): many concurrent clients doing CreateJob,
GetJob, ListJobs and WatchJob while a job trains, with RPC latency percentiles and errors.

Against a running `oombd serve` (--endpoint), through the Python SDK's AsyncClient (client/python,
retries off so that every failed RPC is counted; the WatchJob streams are raw, on its stub, to time
their first message): submits one long training job (--spec-json: a JobSpec as JSON, the job that
trains during the load), then for --duration seconds runs --clients concurrent clients, each a
loop of GetJob (70%), ListJobs (25%, page_size 50) and CreateJob (5%, jobs that queue behind
the training one), plus --watchers WatchJob streams on the training job, each reopened with
after_sequence whenever it ends. Afterwards the created jobs are cancelled.

Prints a markdown table (method, calls, errors, p50, p90, p99, max in ms) and writes --json.
Exit status: 0 when no RPC failed with an unexpected code, 1 otherwise, 77 when grpcio or the
SDK is missing. Latency is measured, not asserted: the benchmark reports it (bench/results).
"""
import argparse
import asyncio
import json
import random
import sys
import time

try:
    import grpc
    import oomb
    from oomb.v1 import jobs_pb2 as pb
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"load_test: skipped: {e}")
    sys.exit(77)


def percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


class Recorder:
    def __init__(self):
        self.latency = {}  # method -> [seconds]
        self.errors = {}   # method -> {code name: count}

    def ok(self, method, seconds):
        self.latency.setdefault(method, []).append(seconds)

    def error(self, method, code):
        self.latency.setdefault(method, [])
        by_code = self.errors.setdefault(method, {})
        by_code[code.name] = by_code.get(code.name, 0) + 1


async def timed(rec, method, coro):
    start = time.perf_counter()
    try:
        result = await coro
    except oomb.OombError as e:
        rec.error(method, e.code)
        return None
    rec.ok(method, time.perf_counter() - start)
    return result


async def first_page(jobs, page_size):
    pages = jobs.list(page_size=page_size)  # the first page only: one ListJobs call
    try:
        async for _ in pages:
            break
    finally:
        await pages.aclose()


async def client_loop(client, rec, deadline, job_names, created, spec, rng):
    while time.monotonic() < deadline:
        r = rng.random()
        if r < 0.70:
            await timed(rec, "GetJob", client.jobs.get(rng.choice(job_names), timeout=10))
        elif r < 0.95:
            await timed(rec, "ListJobs", first_page(client.jobs, 50))
        else:
            job = await timed(rec, "CreateJob", client.jobs.create(spec, timeout=10))
            if job is not None:
                created.append(job.name)
                job_names.append(job.name)


async def watcher(stub, rec, deadline, name):
    after = 0
    while time.monotonic() < deadline:
        call = stub.WatchJob(pb.WatchJobRequest(name=name, after_sequence=after))
        start = time.perf_counter()
        first = True
        try:
            async for msg in call:
                if first:  # time to the snapshot: what a user waits for when opening a watch
                    rec.ok("WatchJob (first message)", time.perf_counter() - start)
                    first = False
                if msg.HasField("event"):
                    after = max(after, msg.event.sequence)
                if time.monotonic() >= deadline:
                    call.cancel()
                    break
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                rec.error("WatchJob (first message)", e.code())
        except asyncio.CancelledError:
            break


async def main_async(args):
    with open(args.spec_json) as f:
        spec = oomb.load_spec(json.load(f))
    rec = Recorder()
    async with oomb.AsyncClient(endpoint=args.endpoint, retry=oomb.RetryPolicy.none()) as client:
        training = await client.jobs.create(spec)
        for _ in range(600):  # wait until it trains
            await training.refresh()
            if training.state == oomb.JobState.RUNNING:
                break
            await asyncio.sleep(0.1)
        job_names = [training.name]
        created = []
        deadline = time.monotonic() + args.duration
        rng = random.Random(args.seed)
        tasks = [client_loop(client, rec, deadline, job_names, created, spec, random.Random(rng.random()))
                 for _ in range(args.clients)]
        tasks += [watcher(client.stub, rec, deadline, training.name) for _ in range(args.watchers)]
        started = time.monotonic()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
        final = await client.jobs.get(training.name)
        for name in created + [training.name]:
            try:
                await client.jobs.cancel(name)
            except oomb.OombError:
                pass  # already ended
    rows, unexpected = [], 0
    for method in sorted(rec.latency):
        lat = sorted(rec.latency[method])
        errs = rec.errors.get(method, {})
        unexpected += sum(errs.values())
        rows.append({"method": method, "calls": len(lat) + sum(errs.values()), "errors": errs,
                     "p50_ms": 1e3 * percentile(lat, 0.50), "p90_ms": 1e3 * percentile(lat, 0.90),
                     "p99_ms": 1e3 * percentile(lat, 0.99), "max_ms": 1e3 * (lat[-1] if lat else 0)})
    report = {"endpoint": args.endpoint, "clients": args.clients, "watchers": args.watchers,
              "duration_s": elapsed, "training_job": training.name,
              "training_job_state_at_end": str(final.state),
              "training_steps_during_load": final.progress.step, "created_jobs": len(created), "rows": rows}
    print(f"| method | calls | errors | p50 ms | p90 ms | p99 ms | max ms |")
    print(f"| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['method']} | {r['calls']} | {r['errors'] or 0} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['max_ms']:.1f} |")
    print(f"{args.clients} clients, {args.watchers} watchers, {elapsed:.1f} s; training job "
          f"{report['training_job_state_at_end']} at step {final.progress.step}; {len(created)} jobs created")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if unexpected:
        print(f"load_test: FAILED: {unexpected} RPCs failed", file=sys.stderr)
        return 1
    print("load_test: ok")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--spec-json", required=True, help="the training job's JobSpec as JSON")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--watchers", type=int, default=8)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the report here")
    sys.exit(asyncio.run(main_async(p.parse_args())))


if __name__ == "__main__":
    main()
