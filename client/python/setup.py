"""Build of the oomb SDK: generates the gRPC modules when the package is built, never at run time.

`build_py` (run by `pip install ./client/python`, `pip wheel`, and editable installs) compiles
with grpc_tools.protoc, which [build-system] requires:

  - ../../proto/oomb/v1/{rules,job_spec,jobs,datasets}.proto into oomb/v1/*_pb2.py (+ .pyi) and
    oomb/v1/{jobs,datasets}_pb2_grpc.py. protoc's output imports `from oomb.v1 import
    job_spec_pb2`, which resolves inside this package, and `from google.api import
    annotations_pb2`, which the runtime requirement googleapis-common-protos provides (its
    installed copy also gives protoc google/api/*.proto: a build requirement too);
  - Debian's grpc-proto /usr/share/grpc-proto/grpc/health/v1/health.proto into
    oomb/v1/health_pb2.py (+ .pyi) and oomb/v1/health_pb2_grpc.py. The descriptor keeps its
    canonical file name (grpc/health/v1/health.proto) and the service its name
    (grpc.health.v1.Health); only the module lives here, where it cannot shadow the grpc package.

The modules go to the build directory (the wheel), or to the source tree for an editable
install; client/python/.gitignore keeps them out of git. Where the .proto files are found:
$OOMB_PROTO_DIR, else ../../proto (this repository), else ./proto (an sdist: `sdist` copies
them there); health.proto: $OOMB_HEALTH_PROTO, else Debian's, else ./proto/grpc/health/v1.

The runtime requirements follow the generator: grpcio at least the grpcio-tools version (the
generated *_pb2_grpc.py refuse older ones) and the protobuf range grpcio-tools itself requires
(the generated *_pb2.py refuse a runtime older than their gencode).
"""
import os
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["oomb/v1/rules.proto", "oomb/v1/job_spec.proto", "oomb/v1/jobs.proto", "oomb/v1/datasets.proto"]
GRPC_PROTOS = ["oomb/v1/jobs.proto", "oomb/v1/datasets.proto"]  # the others declare no service
HEALTH = "grpc/health/v1/health.proto"
DEBIAN_GRPC_PROTO = "/usr/share/grpc-proto"


def proto_root():
    """The directory holding oomb/v1/*.proto."""
    for d in (os.environ.get("OOMB_PROTO_DIR"), os.path.join(HERE, "..", "..", "proto"), os.path.join(HERE, "proto")):
        if d and os.path.isfile(os.path.join(d, PROTOS[-1])):
            return os.path.normpath(d)
    raise RuntimeError("oomb SDK build: no oomb/v1/jobs.proto in $OOMB_PROTO_DIR, ../../proto or ./proto")


def health_root():
    """The include root holding grpc/health/v1/health.proto."""
    env = os.environ.get("OOMB_HEALTH_PROTO")
    if env:
        if not env.endswith(HEALTH) or not os.path.isfile(env):
            raise RuntimeError(f"oomb SDK build: OOMB_HEALTH_PROTO={env} is not a .../{HEALTH}")
        return env[: -len(HEALTH)] or "."
    for d in (DEBIAN_GRPC_PROTO, os.path.join(HERE, "proto")):
        if os.path.isfile(os.path.join(d, HEALTH)):
            return d
    raise RuntimeError(f"oomb SDK build: no {HEALTH} (install Debian's grpc-proto, or set OOMB_HEALTH_PROTO)")


def googleapis_root():
    """The include root holding google/api/annotations.proto (googleapis-common-protos ships it)."""
    import google.api.annotations_pb2 as annotations  # a build requirement

    root = os.path.dirname(os.path.dirname(os.path.dirname(annotations.__file__)))
    if not os.path.isfile(os.path.join(root, "google", "api", "annotations.proto")):
        raise RuntimeError(f"oomb SDK build: googleapis-common-protos at {root} has no google/api/annotations.proto")
    return root


def protoc(args):
    from grpc_tools import protoc as _protoc  # a build requirement

    well_known = os.path.join(os.path.dirname(_protoc.__file__), "_proto")  # google/protobuf/*.proto
    rc = _protoc.main(["grpc_tools.protoc", f"-I{well_known}", f"-I{googleapis_root()}"] + args)
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed ({rc}): {' '.join(args)}")


def generate(package_dir):
    """Writes the generated modules into `package_dir`/v1 (package_dir: the `oomb` package)."""
    v1 = os.path.join(package_dir, "v1")
    os.makedirs(v1, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oomb_sdk_gen_") as tmp:
        root = proto_root()
        protoc([f"-I{root}", f"--python_out={tmp}", f"--pyi_out={tmp}"] + [os.path.join(root, p) for p in PROTOS])
        protoc([f"-I{root}", f"--grpc_python_out={tmp}"] + [os.path.join(root, p) for p in GRPC_PROTOS])
        for name in os.listdir(os.path.join(tmp, "oomb", "v1")):
            shutil.copyfile(os.path.join(tmp, "oomb", "v1", name), os.path.join(v1, name))
        hroot = health_root()
        protoc([f"-I{hroot}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
                os.path.join(hroot, HEALTH)])
        gen = os.path.join(tmp, "grpc", "health", "v1")
        for name in ("health_pb2.py", "health_pb2.pyi"):
            shutil.copyfile(os.path.join(gen, name), os.path.join(v1, name))
        with open(os.path.join(gen, "health_pb2_grpc.py"), encoding="utf-8") as f:
            code = f.read()
        fixed = code.replace("from grpc.health.v1 import health_pb2 as", "from oomb.v1 import health_pb2 as")
        if fixed == code:
            raise RuntimeError("oomb SDK build: health_pb2_grpc.py does not import grpc.health.v1.health_pb2")
        with open(os.path.join(v1, "health_pb2_grpc.py"), "w", encoding="utf-8") as f:
            f.write(fixed)


class build_py(_build_py):
    """build_py that also generates oomb/v1's gRPC modules."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            generate(os.path.join(HERE, "oomb"))
        else:
            generate(os.path.join(self.build_lib, "oomb"))


class sdist(_sdist):
    """sdist that carries the .proto files (./proto), so that it builds outside this repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for rel in PROTOS:
            dst = os.path.join(base_dir, "proto", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(proto_root(), rel), dst)
        dst = os.path.join(base_dir, "proto", HEALTH)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(health_root(), HEALTH), dst)


def requirements():
    """grpcio and protobuf as the installed grpcio-tools' generated code needs them, and pyyaml."""
    try:
        from importlib import metadata

        tools = metadata.version("grpcio-tools")
        protobuf = [r for r in (metadata.requires("grpcio-tools") or []) if re.match(r"protobuf\b", r)]
        grpcio = f"grpcio>={tools}"
    except Exception:  # pragma: no cover - metadata without grpcio-tools installed
        protobuf, grpcio = [], "grpcio"
    return [grpcio] + [r.split(";")[0].strip() for r in protobuf or ["protobuf"]] + [
        "pyyaml>=5.1",
        "googleapis-common-protos>=1.56",
    ]


setup(cmdclass={"build_py": build_py, "sdist": sdist}, install_requires=requirements())
