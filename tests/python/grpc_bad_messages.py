#!/usr/bin/env python3
"""Malformed and oversized gRPC messages against a running `oombd serve` (issue 11).

Driven by tests/server/daemon_integration_test.cc (DaemonBadInput.MalformedAndOversizedMessages),
through the Python SDK (client/python) and its channel:
  1. bytes that are not a CreateJobRequest, sent to CreateJob: refused (not OK), daemon alive;
  2. a CreateJobRequest of ~5 MiB (a huge display_name): RESOURCE_EXHAUSTED (the 4 MiB receive
     limit), daemon alive;
  3. an unknown method: UNIMPLEMENTED;
  4. a spec with 10^12-token context, rank 0 and a negative learning rate: INVALID_ARGUMENT
     naming the field (oomb.InvalidArgument, its `field` the spec field);
  5. afterwards GetServerInfo and the health check still answer.
Exit status: 0 ok, 1 a check failed, 77 grpcio or the SDK missing (the test skips).
"""
import argparse
import os
import sys

try:
    import grpc
    import oomb
    from oomb.v1 import job_spec_pb2 as spec_pb
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"grpc_bad_messages: skipped: {e}")
    sys.exit(77)


def check(cond, msg):
    if not cond:
        print(f"grpc_bad_messages: FAILED: {msg}", file=sys.stderr)
        sys.exit(1)


def code_of(call):
    try:
        call()
    except grpc.RpcError as e:  # a raw call on the SDK's channel
        return e.code(), e.details()
    except oomb.OombError as e:  # an SDK call
        return e.code, e.message
    return grpc.StatusCode.OK, ""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    a = p.parse_args()
    # No retries: every refusal must surface as it is.
    client = oomb.Client(endpoint=a.endpoint, timeout=30, retry=oomb.RetryPolicy.none(),
                         options=[("grpc.max_send_message_length", 64 << 20)])
    channel = client.channel

    def alive():
        info = client.server_info(timeout=10)
        return bool(info.version) and client.health(timeout=10) == "SERVING"

    raw = channel.unary_unary("/oomb.v1.JobService/CreateJob", request_serializer=None,
                              response_deserializer=None)
    for garbage in (b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", os.urandom(4096)):
        code, details = code_of(lambda garbage=garbage: raw(garbage, timeout=10))
        check(code != grpc.StatusCode.OK, f"garbage accepted: {garbage[:8]!r}")
        print(f"garbage {len(garbage)} bytes -> {code.name}: {details}")
    check(alive(), "daemon not serving after garbage")

    spec = spec_pb.JobSpec()
    spec.model.path = a.model
    spec.data.train = a.train
    spec.training.max_steps = 1
    spec.display_name = "x" * (5 << 20)
    code, details = code_of(lambda: client.jobs.create(spec))
    check(code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"5 MiB request: {code.name} {details}")
    print(f"5 MiB request -> {code.name}: {details}")
    check(alive(), "daemon not serving after an oversized message")

    unknown = channel.unary_unary("/oomb.v1.JobService/NoSuchMethod", request_serializer=None,
                                  response_deserializer=None)
    code, _ = code_of(lambda: unknown(b"", timeout=10))
    check(code == grpc.StatusCode.UNIMPLEMENTED, f"unknown method: {code.name}")

    for field, mutate in (("data.max_seq_len", lambda s: setattr(s.data, "max_seq_len", 10**12)),
                          ("method.lora.rank", lambda s: setattr(s.method.lora, "rank", 0)),
                          ("training.learning_rate", lambda s: setattr(s.training, "learning_rate", -1.0))):
        s = spec_pb.JobSpec()
        s.model.path = a.model
        s.data.train = a.train
        s.training.max_steps = 1
        mutate(s)
        try:
            client.jobs.create(s, timeout=10)
            check(False, f"{field}: accepted")
        except oomb.InvalidArgument as e:
            check(e.code == grpc.StatusCode.INVALID_ARGUMENT and field in e.message and e.field == f"spec.{field}",
                  f"{field}: {e.code.name} field {e.field}: {e.message}")
            print(f"{field} -> {e.code.name} (field {e.field}): {e.message}")
    check(alive(), "daemon not serving at the end")
    print("grpc_bad_messages: ok")


if __name__ == "__main__":
    main()
