# oombd + oomb on the CUDA runtime. Multi-stage: build on the CUDA devel image with the same
# setup script as developer machines and CI (scripts/setup.sh), run on the matching runtime image
# with only the binaries and the shared libraries they load (found with ldd, as
# scripts/gpu_pack.sh does for the GPU machine).
#
#   docker build --build-arg OOMB_GIT_SHA=$(git rev-parse --short=12 HEAD) -t oomb .
#   docker run --gpus all -p 7070:7070 -p 7071:7071 -p 7072:7072 -v oomb-data:/var/lib/oomb oomb
#
# gRPC on 7070, Prometheus /metrics on 7071 (docs/metrics.md), HTTP/JSON on 7072; the plaintext health port 7073
# when server.health_listen sets it. Kubernetes and systemd: docs/DEPLOY.md (deploy/k8s uses
# this image's user, uid and gid 10001).
#
# Not built on the developer machines (no Docker engine there); kept consistent with
# scripts/setup.sh, which is the tested path.

ARG CUDA_VERSION=13.0.1
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive OOMB_VENV=/opt/venv
# oomb_build_info's git_sha when the build context has no .git (cmake/GitSha.cmake).
ARG OOMB_GIT_SHA=
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv sudo && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/setup.sh scripts/python-requirements.lock scripts/mlflow-requirements.lock scripts/peft-previous.lock scripts/
RUN bash scripts/setup.sh
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOOMB_BUILD_TESTS=OFF \
 && cmake --build build --target oombd oomb
# The binaries and every shared library they need that the runtime image lacks (LibTorch, the
# CUDA libraries it was built with, gRPC, Abseil, ...).
RUN mkdir -p /opt/oomb/bin /opt/oomb/lib \
 && cp build/server/oombd build/client/oomb /opt/oomb/bin/ \
 && for b in /opt/oomb/bin/*; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u \
    | grep -vE '^/lib/x86_64-linux-gnu/(libc|libm|libdl|librt|libpthread|ld-linux)' \
    | xargs -I{} cp -L {} /opt/oomb/lib/ \
 && strip --strip-unneeded /opt/oomb/bin/*

FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 oomb \
 && useradd --system --uid 10001 --gid oomb --create-home --home-dir /var/lib/oomb oomb
COPY --from=build /opt/oomb /opt/oomb
ENV PATH=/opt/oomb/bin:$PATH LD_LIBRARY_PATH=/opt/oomb/lib OOMB_DATA_HOME=/var/lib/oomb
USER oomb
VOLUME /var/lib/oomb
EXPOSE 7070 7071 7072 7073
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s CMD ["oomb", "--endpoint", "127.0.0.1:7070", "health"]
ENTRYPOINT ["oombd"]
CMD ["serve", "--listen", "0.0.0.0:7070", "--metrics-listen", "0.0.0.0:7071", "--http-listen", "0.0.0.0:7072"]
