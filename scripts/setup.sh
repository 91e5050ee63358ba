#!/usr/bin/env bash
# Installs everything oomb needs on a fresh Debian 12 machine. Idempotent: when everything is
# present it only checks, in a few seconds.
#
#   scripts/setup.sh            Debian packages + the Python virtual environment (LibTorch)
#
# Environment:
#   OOMB_MLFLOW_VENV  where MLflow's tracking server is installed, for the tracking test
#               (default: ~/.cache/oomb/mlflow-venv)
#   OOMB_VENV   where the virtual environment lives (default: ~/.cache/oomb/venv). It holds
#               the PyPI wheel torch==2.11.0, whose share/cmake is LibTorch's CMake package,
#               the Python packages the reference-parity tests use, lizard, which the
#               function-length lint runs (scripts/lint_function_length.py), and ruff, the
#               Python lint (scripts/lint.sh, ruff.toml): exactly the versions and hashes of
#               scripts/python-requirements.lock.
set -euo pipefail

OOMB_VENV="${OOMB_VENV:-$HOME/.cache/oomb/venv}"
TORCH_VERSION=2.11.0

# Debian packages, grouped by what needs them (docs/CONVENTIONS.md §1).
APT_PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git clang-format
  # API and service
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev prometheus-cpp-dev libyaml-cpp-dev libsqlite3-dev libsqlitecpp-dev
  nlohmann-json3-dev libsimdjson-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev
  libpqxx-dev libsystemd-dev zlib1g-dev libssl-dev
  # integration surface: the HTTP/JSON gateway's event loop and its TLS, the tests' stand-in HTTP
  # receivers, checkpoint archives (tar), webhooks' client
  libmicrohttpd-dev libgnutls28-dev libcpp-httplib-dev libarchive-dev libcurl4-openssl-dev
  # engine: Gloo's headers for LibTorch's c10d ProcessGroupGloo (data parallelism on the CPU)
  libgloo-dev
  # tests
  libgtest-dev libgmock-dev libbenchmark-dev prometheus postgresql tmux openssl libcairo2
  # the metrics test draws a job's curve in a real browser (Prometheus' graph page)
  chromium-headless-shell
  python3-venv
  # fuzzing (tests/fuzz/run.sh): clang with libFuzzer and the sanitizer runtimes
  clang clang-14 libclang-rt-14-dev
)

log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The prometheus and postgresql packages start system services on install; the tests run
  # their own instances on loopback, so the system ones are not needed.
  for svc in prometheus postgresql; do $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true; done
else
  log "Debian packages present"
fi

# Python environment: LibTorch (the PyPI wheel, with its CUDA runtime wheels as dependencies, so
# libtorch_cuda.so links and loads on a machine without a GPU), the reference-parity stack and
# the test tools, at the exact versions and hashes of scripts/python-requirements.lock (made from
# scripts/python-requirements.in, which says why each package is there and how to remake the
# lock): a fresh machine today or next month installs what CI installed. An environment made
# from an older lock is brought to this one in place (pip install of the lock, then pip check).
REQ_LOCK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python-requirements.lock"
stamp="$OOMB_VENV/.oomb-setup-$(cat "$REQ_LOCK" "$(dirname "$REQ_LOCK")/peft-previous.lock" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  log "creating Python environment in $OOMB_VENV (scripts/python-requirements.lock)"
  [ -x "$OOMB_VENV/bin/python" ] || python3 -m venv "$OOMB_VENV"
  "$OOMB_VENV/bin/python" -m pip install -q --upgrade pip
  "$OOMB_VENV/bin/python" -m pip install -q --require-hashes -r "$REQ_LOCK"
  "$OOMB_VENV/bin/python" -m pip check >&2
  # The previous PEFT release in a directory of its own, for tests/python/check_peft_adapter.py.
  rm -rf "$OOMB_VENV"/peft-*
  "$OOMB_VENV/bin/python" -m pip install -q --no-deps --require-hashes --target "$OOMB_VENV/peft-0.21.2" \
    -r "$(dirname "$REQ_LOCK")/peft-previous.lock"
  rm -f "$OOMB_VENV"/.oomb-setup-*
  touch "$stamp"
else
  log "Python environment present ($OOMB_VENV)"
fi

# MLflow's own tracking server, which the tracking test talks to (tests/python/test_mlflow.py):
# in an environment of its own, so that its many dependencies stay out of the reference stack;
# pinned with hashes likewise (scripts/mlflow-requirements.lock).
MLFLOW_VENV="${OOMB_MLFLOW_VENV:-$HOME/.cache/oomb/mlflow-venv}"
MLFLOW_LOCK="$(dirname "$REQ_LOCK")/mlflow-requirements.lock"
mlflow_stamp="$MLFLOW_VENV/.oomb-mlflow-$(sha1sum "$MLFLOW_LOCK" | cut -c1-12)"
if [ ! -f "$mlflow_stamp" ]; then
  log "installing MLflow in $MLFLOW_VENV (scripts/mlflow-requirements.lock)"
  [ -x "$MLFLOW_VENV/bin/python" ] || python3 -m venv "$MLFLOW_VENV"
  "$MLFLOW_VENV/bin/python" -m pip install -q --require-hashes -r "$MLFLOW_LOCK"
  rm -f "$MLFLOW_VENV"/.oomb-mlflow-*
  touch "$mlflow_stamp"
fi

# The Python SDK (client/python, package `oomb`), which the Python tests and bench/load import.
# Built with the environment's grpcio-tools (--no-build-isolation: its generated modules then
# match the environment's grpcio and protobuf, and nothing is downloaded). Installed again only
# when its sources, the .proto files or the package set above change: their hash is the stamp.
# Skipped where the script runs without the sources (the Dockerfile's first stage copies only it).
install_sdk() {
  local root sdk_hash sdk_stamp="$OOMB_VENV/.oomb-sdk"
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if [ ! -f "$root/client/python/pyproject.toml" ]; then
    log "no client/python beside this script: Python SDK not installed"
    return
  fi
  sdk_hash=$(
    cd "$root"
    {
      find client/python proto -type f \( -name '*.py' -o -name '*.proto' -o -name '*.toml' -o -name '*.md' \
        -o -name py.typed \) -not -path 'client/python/build/*' -not -path '*.egg-info/*' \
        -not -path '*/__pycache__/*' -not -name '*_pb2.py' -not -name '*_pb2_grpc.py' -print0 |
        sort -z | xargs -0 sha1sum
      sha1sum /usr/share/grpc-proto/grpc/health/v1/health.proto 2>/dev/null || true
      echo "$stamp"
    } | sha1sum | cut -c1-16
  )
  if [ "$(cat "$sdk_stamp" 2>/dev/null)" != "$sdk_hash" ]; then
    log "installing the Python SDK (client/python)"
    "$OOMB_VENV/bin/python" -m pip install -q --no-build-isolation "$root/client/python"
    echo "$sdk_hash" >"$sdk_stamp"
  else
    log "Python SDK present"
  fi
}
install_sdk

"$OOMB_VENV/bin/python" -c "import torch; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__"
log "ready: torch $("$OOMB_VENV/bin/python" -c 'import torch; print(torch.__version__)')"
