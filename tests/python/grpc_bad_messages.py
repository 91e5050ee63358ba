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
import tempfile

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"grpc_bad_messages: skipped: {e}")
    sys.exit(77)


def check(cond, msg):
    if not cond:
        print(f"grpc_bad_messages: FAILED: {msg}", file=sys.stderr)
        sys.exit(1)


HEALTH_PROTO_DIR = "/usr/share/grpc-proto"  # Debian's grpc-proto (scripts/setup.sh)


def stubs(proto_dir):
    out = tempfile.mkdtemp(prefix="oomb_bad_")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    # health.proto compiled from a copy at the top level: module health_pb2 (its path under
    # grpc/ would shadow the grpc package); the service keeps its name, grpc.health.v1.Health.
    health_dir = os.path.join(out, "health_src")
    os.makedirs(health_dir)
    with open(os.path.join(HEALTH_PROTO_DIR, "grpc", "health", "v1", "health.proto")) as src, \
            open(os.path.join(health_dir, "health.proto"), "w") as dst:
        dst.write(src.read())
    for root, protos in ((proto_dir, [os.path.join("oomb", "v1", f) for f in ("job_spec.proto", "jobs.proto")]),
                         (health_dir, ["health.proto"])):
        check(protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={out}",
                           f"--grpc_python_out={out}"] + protos) == 0, f"protoc {protos}")
    sys.path.insert(0, out)
    from oomb.v1 import job_spec_pb2, jobs_pb2, jobs_pb2_grpc  # noqa: E402
    import health_pb2, health_pb2_grpc  # noqa: E402
    return job_spec_pb2, jobs_pb2, jobs_pb2_grpc, health_pb2, health_pb2_grpc


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
    spec_pb, pb, pb_grpc, health_pb2, health_pb2_grpc = stubs(a.proto_dir)
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
