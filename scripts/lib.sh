# Shared by scripts/up and scripts/test: prerequisites and the Python environment.
# shellcheck shell=bash
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UV_VERSION=0.13.8

need() {  # need TOOL "how to install it"
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "error: $1 not found: install $2" >&2
    exit 2
  fi
}

check_prerequisites() {
  need python3 "Python 3.11 or newer (Debian: apt-get install python3 python3-venv)"
  python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
    echo "error: Python $(python3 -V 2>&1) is too old: install Python 3.11 or newer" >&2; exit 2; }
  need go "Go 1.26 or newer (https://go.dev/doc/install)"
  need gcc "gcc (Debian: apt-get install gcc)"
  need openssl "openssl (Debian: apt-get install openssl)"
}

browser_prereq() {
  # tests/e2e/test_web.py drives Debian's headless Chromium; CI machines start without it.
  [ -x /usr/bin/chromium ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium and chromium-driver (the web page's test)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
  else
    echo "warning: /usr/bin/chromium not found: install chromium and chromium-driver" \
      "(Debian: sudo apt-get install chromium chromium-driver); the web page test skips (fails under CI)" >&2
  fi
}

NODE_PACKAGES=(runc containernetworking-plugins mmdebstrap iproute2 util-linux procps python3)
node_prereq() {
  # The dev cluster's real node (devcluster/node.py): Debian's runc and CNI plugins, mmdebstrap
  # for the images' Debian rootfs, ip/nsenter/unshare for its network namespace, and Debian's
  # python3 (the images' venv is built with the very interpreter the rootfs has).
  local missing=()
  [ -x /usr/sbin/runc ] || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
  command -v sysctl >/dev/null 2>&1 || missing+=(procps)
  [ -x /usr/bin/python3 ] || missing+=(python3)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing ${missing[*]} (the dev cluster's real node)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "warning: ${missing[*]} missing: install them (Debian: sudo apt-get install" \
      "${NODE_PACKAGES[*]}); \`taugrid dev up\` then runs without the real node and says why" >&2
  fi
}

STAGE_T0=$SECONDS
stage() {  # stage NAME: print the stage's start and, at the next stage or the end, its time
  stage_end
  STAGE_NAME=$1; STAGE_START=$SECONDS
  echo "[stage] $STAGE_NAME (at $((SECONDS - STAGE_T0))s)"
}
stage_end() {
  if [ -n "${STAGE_NAME:-}" ]; then
    echo "[stage] $STAGE_NAME: $((SECONDS - STAGE_START))s"
    STAGE_NAME=""
  fi
}

uv_version_of() {  # uv_version_of UV: the version a uv binary reports, empty if none
  "$1" --version 2>/dev/null | cut -d' ' -f2 || true
}

uv_bootstrap() {
  # Put uv $UV_VERSION first on PATH: the one already there when it is that version, else
  # one in a private venv under the cache ($TAUGRID_CACHE, default ~/.cache/taugrid).
  # Never `pip install` into the system Python: PEP 668 refuses it on Debian 12 and Ubuntu
  # >= 23.04 ("externally-managed-environment"), and Debian's python3 has no pip anyway.
  if command -v uv >/dev/null 2>&1 && [ "$(uv_version_of uv)" = "$UV_VERSION" ]; then
    return 0
  fi
  local venv="${TAUGRID_CACHE:-$HOME/.cache/taugrid}/uv-$UV_VERSION"
  if [ "$(uv_version_of "$venv/bin/uv")" != "$UV_VERSION" ]; then
    echo "[setup] installing uv $UV_VERSION into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null 2>&1; then
      rm -rf "$venv"
      echo "[setup] installing python3-venv (Debian's python3 makes no venv without it)"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
      python3 -m venv "$venv" >/dev/null 2>&1 || true
    fi
    if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
      rm -rf "$venv"
      echo "error: python3 -m venv failed: install python3-venv" \
        "(Debian/Ubuntu: apt-get install python3-venv)" >&2
      exit 2
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  fi
  PATH="$venv/bin:$PATH"
  export PATH
}

python_env() {
  # uv installs the locked dependency set (uv.lock) into .venv; CI never drifts.
  uv_bootstrap
  (cd "$ROOT" && uv sync --frozen --quiet)
}
