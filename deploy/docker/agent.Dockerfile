# syntax=docker/dockerfile:1
# The TauGrid agent image: the locked dependency set (uv.lock) and the `agent` and `shared`
# packages in one virtual environment, on a slim Python runtime, plus DCGM's `dcgmi` client.
#
# No CUDA base image: NVML (libnvidia-ml.so.1) and the GPU device nodes are the host driver's,
# injected at start by the NVIDIA container toolkit (the chart sets NVIDIA_VISIBLE_DEVICES=all
# and NVIDIA_DRIVER_CAPABILITIES=utility, or agent.runtimeClassName: nvidia). A driver library
# baked into the image would not match the node's kernel module.
#
# Build from the repository root (the context must hold pyproject.toml and uv.lock):
#   docker build -f deploy/docker/agent.Dockerfile -t "$REGISTRY/taugrid/agent:0.1.0" .
# Without DCGM (NVML only; the agent says so in /v1/gpus): --build-arg DCGM_PACKAGE=
#
# Pin both base images by digest in CI, so a rebuild of the same commit gives the same image:
#   --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest>
#   --build-arg UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8@sha256:<digest>
# and pin DCGM too: --build-arg DCGM_VERSION=<the apt version, e.g. 1:4.x.y-1>
#                   --build-arg CUDA_KEYRING_SHA256=<sha256 of cuda-keyring_1.1-1_all.deb>
# The builder and the runtime must use the same PYTHON_IMAGE: the virtual environment's
# interpreter is a link to /usr/local/bin/python3.11 of that image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder
COPY --from=uv /uv /usr/local/bin/uv
# Bytecode is compiled here because the runtime's root filesystem is read-only.
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
# hatchling skips the wheel packages that are absent (controller, devcluster).
COPY pyproject.toml uv.lock README.md ./
COPY shared/ shared/
COPY agent/ agent/
# The wheel declares every console script; drop the two whose packages are not here.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable \
    && rm -f /opt/venv/bin/tau /opt/venv/bin/taugrid /opt/venv/bin/taugrid-controller

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
# DCGM's client from NVIDIA's CUDA apt repository. `dcgmi` only talks to an nv-hostengine over
# the network (the GPU Operator's nvidia-dcgm; TAUGRID_AGENT_DCGM_HOSTENGINE), so the core
# package is enough: no hostengine runs here, and no CUDA diagnostics plugins are installed.
# An empty DCGM_PACKAGE builds an NVML-only image.
ARG DCGM_PACKAGE=datacenter-gpu-manager-4-core
ARG DCGM_VERSION=""
ARG CUDA_REPO=debian12
ARG CUDA_KEYRING_SHA256=""
ARG TARGETARCH
LABEL org.opencontainers.image.title="taugrid-agent" \
      org.opencontainers.image.description="TauGrid GPU health agent: NVML, the kernel log and DCGM, dcgm-exporter-compatible metrics, heartbeats" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The keyring is fetched with the image's own Python, so no curl or wget stays behind.
RUN set -eu; \
    if [ -n "${DCGM_PACKAGE}" ]; then \
      case "${TARGETARCH:-amd64}" in \
        amd64) repo_arch=x86_64 ;; \
        arm64) repo_arch=sbsa ;; \
        *) echo "no NVIDIA CUDA repository for TARGETARCH=${TARGETARCH}" >&2; exit 1 ;; \
      esac; \
      python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
        "https://developer.download.nvidia.com/compute/cuda/repos/${CUDA_REPO}/${repo_arch}/cuda-keyring_1.1-1_all.deb" \
        /tmp/cuda-keyring.deb; \
      if [ -n "${CUDA_KEYRING_SHA256}" ]; then \
        echo "${CUDA_KEYRING_SHA256}  /tmp/cuda-keyring.deb" | sha256sum --check --strict -; \
      fi; \
      dpkg -i /tmp/cuda-keyring.deb; \
      rm -f /tmp/cuda-keyring.deb; \
      apt-get update; \
      apt-get install -y --no-install-recommends "${DCGM_PACKAGE}${DCGM_VERSION:+=${DCGM_VERSION}}"; \
      apt-get clean; \
      rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=builder /opt/venv /opt/venv
# Read-only root filesystem: nothing is written at run time but the state file. The chart
# mounts /tmp (emptyDir), /var/lib/taugrid (hostPath: the latched-fault state file, the
# default TAUGRID_AGENT_STATE_PATH), /var/run/secrets/tokens (the projected token, audience
# taugrid) and /etc/taugrid/controller-ca; the settings' defaults already name these paths.
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Root, as the chart's agent securityContext (runAsUser: 0) expects, because:
# - /dev/kmsg, read back to boot, is the one source of Xids raised while the agent was down;
#   under dmesg_restrict the kernel gives it only to a process with CAP_SYSLOG, and the
#   SYSLOG capability the chart adds is effective only for uid 0 (Kubernetes grants no
#   ambient capabilities to other users);
# - the latched-fault state file lives in a hostPath directory (/var/lib/taugrid) that the
#   kubelet creates root-owned, and latches must survive agent restarts;
# - NVML opens the injected /dev/nvidia* nodes; as root the agent does not depend on the
#   modes a driver or toolkit configuration gives them.
# The chart drops every other capability, forbids privilege escalation and mounts the root
# filesystem read-only; only `agent.privileged: true` widens that.
USER 0:0
# /metrics (dcgm-exporter's port), /healthz, /readyz and the node-local API (TAUGRID_AGENT_PORT).
EXPOSE 9400
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz.
ENTRYPOINT ["taugrid-agent"]
