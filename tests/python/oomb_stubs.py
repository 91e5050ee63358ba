"""Python stubs of oombd's API, generated from proto/ with grpc_tools.protoc into a temporary
directory — what the Python test and benchmark clients import (the way an ML platform would
integrate the API). Needs grpcio and grpcio-tools (scripts/setup.sh puts them in the venv).

    from oomb_stubs import generate
    api = generate("proto")          # api.spec (job_spec_pb2), api.jobs (jobs_pb2), api.grpc (jobs_pb2_grpc)
    api = generate("proto", health=True)   # also api.health, api.health_grpc (grpc.health.v1)
"""
import os
import sys
import tempfile
import types

from grpc_tools import protoc

HEALTH_PROTO = "/usr/share/grpc-proto/grpc/health/v1/health.proto"  # Debian's grpc-proto


def _protoc(root, protos, out):
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")  # well-known types
    rc = protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"] + protos)
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed ({rc}) on {protos}")


def generate(proto_dir, health=False):
    out = tempfile.mkdtemp(prefix="oomb_stubs_")
    _protoc(proto_dir, [os.path.join("oomb", "v1", f) for f in ("rules.proto", "job_spec.proto", "jobs.proto")], out)
    if health:
        # Compiled from a copy at the top level, as module health_pb2: under grpc/ it would
        # shadow the grpc package. The service keeps its name, grpc.health.v1.Health.
        src = os.path.join(out, "health_src")
        os.makedirs(src)
        with open(HEALTH_PROTO) as f, open(os.path.join(src, "health.proto"), "w") as g:
            g.write(f.read())
        _protoc(src, ["health.proto"], out)
    sys.path.insert(0, out)
    from oomb.v1 import job_spec_pb2, jobs_pb2, jobs_pb2_grpc  # noqa: E402  (generated just now)
    api = types.SimpleNamespace(spec=job_spec_pb2, jobs=jobs_pb2, grpc=jobs_pb2_grpc)
    if health:
        import health_pb2, health_pb2_grpc  # noqa: E402
        api.health, api.health_grpc = health_pb2, health_pb2_grpc
    return api
