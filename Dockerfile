# syntax=docker/dockerfile:1
# The tokenyard image: one image for every component. The chart runs `tokenyard operator|router|autoscaler ...`;
# `docker run IMAGE sim serve --help` works the same way.
#
#   make image                      # docker, podman or buildah, whichever is installed
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/tokenyard/tokenyard:0.1.0 .
#
# Stage 1 generates the gRPC code (proto/tokenyard/v1/*_pb2*.py, not in git) and builds the tokenyard wheel and
# the wheels of its runtime dependencies; stage 2 installs them from that directory only (no index, no dev
# extras, no compilers), runs as a numeric non-root user and writes nowhere but /tmp.

# Exact tag, no digest: bump it (and rebuild) for Python and Debian security releases.
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (pyproject.toml's [tool.hatch.build.targets.wheel] packages, and the
# README it names). Not .gitignore: hatchling leaves out every file git ignores, which includes the
# generated *_pb2*.py that the router imports.
COPY pyproject.toml README.md ./
COPY core/ core/
COPY operator/ operator/
COPY router/ router/
COPY autoscaler/ autoscaler/
COPY sim/ sim/
COPY devcluster/ devcluster/
COPY proto/ proto/
# The same command as `make proto`; grpcio-tools is pinned so that the generated code is reproducible.
RUN pip install grpcio-tools==1.85.1 \
    && rm -f proto/tokenyard/v1/*_pb2*.py proto/tokenyard/v1/*_pb2*.pyi \
    && python -m grpc_tools.protoc -Iproto --python_out=proto --pyi_out=proto --grpc_python_out=proto \
        proto/tokenyard/v1/*.proto \
    && pip wheel --wheel-dir /wheels . \
    && python -c "import glob, sys, zipfile; \
names = zipfile.ZipFile(glob.glob('/wheels/tokenyard-*.whl')[0]).namelist(); \
sys.exit(0 if 'tokenyard/v1/router_pb2_grpc.py' in names else 'the wheel lacks the generated gRPC code')"

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tokenyard" \
      org.opencontainers.image.description="Control plane for serving LLMs on Kubernetes: operator, router and autoscaler" \
      org.opencontainers.image.source="https://github.com/tokenyard/tokenyard" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
# pip compiles the bytecode at install time, so a read-only root file system costs no start-up time.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "tokenyard==${VERSION}" \
    && groupadd --system --gid 65532 tokenyard \
    && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin tokenyard
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["tokenyard"]
CMD ["--help"]
