#!/usr/bin/env python3
"""Malformed and oversized gRPC messages against a running `oombd serve` (issue 11).

Driven by tests/server/daemon_integration_test.cc (DaemonBadInput.MalformedAndOversizedMessages):
  1. bytes that are not a CreateJobRequest, sent to CreateJob: refused (not OK), daemon alive;
  2. a CreateJobRequest of ~5 MiB (a huge display_name): RESOURCE_EXHAUSTED (the 4 MiB receive
     limit), daemon alive;
  3. an unknown method: UNIMPLEMENTED;
  4. a spec with 10^12-token context, rank 0 and a negative learning rate: INVALID_ARGUMENT
     naming the field;
  5. afterwards GetServerInfo and the health check still answer.
Exit status: 0 ok, 1 a check failed, 77 grpcio missing (the test skips).
"""
import argparse
import os
import sys

try:
    import grpc
    import oomb_stubs
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
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--proto-dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    a = p.parse_args()
    api = oomb_stubs.generate(a.proto_dir, health=True)
    spec_pb, pb, pb_grpc, health_pb2, health_pb2_grpc = api.spec, api.jobs, api.grpc, api.health, api.health_grpc
    channel = grpc.insecure_channel(a.endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
    stub = pb_grpc.JobServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)

    def alive():
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        return bool(info.version) and status == health_pb2.HealthCheckResponse.SERVING

    raw = channel.unary_unary("/oomb.v1.JobService/CreateJob", request_serializer=None,
                              response_deserializer=None)
    for garbage in (b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", os.urandom(4096)):
        code, details = code_of(lambda: raw(garbage, timeout=10))
        check(code != grpc.StatusCode.OK, f"garbage accepted: {garbage[:8]!r}")
        print(f"garbage {len(garbage)} bytes -> {code.name}: {details}")
    check(alive(), "daemon not serving after garbage")

    spec = spec_pb.JobSpec()
    spec.model.path = a.model
    spec.data.train = a.train
    spec.training.max_steps = 1
    spec.display_name = "x" * (5 << 20)
    code, details = code_of(lambda: stub.CreateJob(pb.CreateJobRequest(spec=spec), timeout=30))
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
        code, details = code_of(lambda: stub.CreateJob(pb.CreateJobRequest(spec=s), timeout=10))
        check(code == grpc.StatusCode.INVALID_ARGUMENT and field in details, f"{field}: {code.name} {details}")
        print(f"{field} -> {code.name}: {details}")
    check(alive(), "daemon not serving at the end")
    print("grpc_bad_messages: ok")


if __name__ == "__main__":
    main()
