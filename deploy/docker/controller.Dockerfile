# syntax=docker/dockerfile:1
# The TauGrid controller image: the locked dependency set (uv.lock) and the `controller` and
# `shared` packages in one virtual environment, on a slim Python runtime with no compilers.
#
# Build from the repository root (the context must hold pyproject.toml and uv.lock):
#   docker build -f deploy/docker/controller.Dockerfile -t "$REGISTRY/taugrid/controller:0.1.0" .
#
# Pin both base images by digest in CI, so a rebuild of the same commit gives the same image:
#   --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest>
#   --build-arg UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8@sha256:<digest>
# The builder and the runtime must use the same PYTHON_IMAGE: the virtual environment's
# interpreter is a link to /usr/local/bin/python3.11 of that image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder
COPY --from=uv /uv /usr/local/bin/uv
# Bytecode is compiled here because the runtime's root filesystem is read-only: without .pyc
# files every start would recompile kubernetes_asyncio's thousand modules in memory.
# UV_PYTHON_DOWNLOADS=never keeps uv on the image's interpreter; a uv-managed one would live
# outside the copied environment.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=python3.11 \
    UV_PROJECT_ENVIRONMENT=/opt/venv
WORKDIR /src
# The dependencies alone first: this layer is rebuilt only when the lock changes.
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=bind,source=pyproject.toml,target=pyproject.toml \
    --mount=type=bind,source=uv.lock,target=uv.lock \
    uv sync --frozen --no-dev --no-editable --no-install-project
# Then the project, as a wheel (not editable), built from only the packages this image runs:
# hatchling skips the wheel packages that are absent (agent, devcluster).
COPY pyproject.toml uv.lock README.md ./
COPY shared/ shared/
COPY controller/ controller/
# The wheel declares every console script; drop the two whose packages are not here.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable \
    && rm -f /opt/venv/bin/taugrid /opt/venv/bin/taugrid-agent

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="taugrid-controller" \
      org.opencontainers.image.description="TauGrid controller: fleet health, node quarantine, the Kueue gpu-health AdmissionCheck, the run API and reconciler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# A named account for the chart's runAsUser/runAsGroup 65532 (distroless's "nonroot"), so
# tools that look the user up find one; it owns nothing in the image.
RUN groupadd --system --gid 65532 taugrid \
    && useradd --system --uid 65532 --gid 65532 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin taugrid
COPY --from=builder /opt/venv /opt/venv
# Read-only root filesystem: nothing is written at run time (no .pyc, no home directory);
# the chart mounts an emptyDir on /tmp and the TLS Secret on /etc/taugrid/tls.
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
# The HTTP(S) API, /metrics, /healthz and /readyz (TAUGRID_CONTROLLER_PORT).
EXPOSE 8080
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz.
ENTRYPOINT ["taugrid-controller"]
