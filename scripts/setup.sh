#!/usr/bin/env bash
# Prepare this machine for Crucible (idempotent; `make setup` runs it):
#   1. Python: .venv with the project installed editable (skipped when pyproject.toml is unchanged)
#   2. Docker engine: reuse a reachable one; else install docker.io (apt) and start dockerd
#   3. debootstrap, when the base image is to be built here (BASE_IMAGE unset)
#   4. chromium and chromium-driver (apt) for the dashboard's browser tests
# Environment: PYTHON (interpreter for the venv), BASE_IMAGE / CRUCIBLE_BASE_IMAGE.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE_DIR=.crucible
mkdir -p "$STATE_DIR/logs"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else return 1
  fi
}

APT_UPDATED=
apt_install() {  # apt_install PKG...: install with apt-get (root or sudo), quietly
  command -v apt-get >/dev/null 2>&1 || return 1
  if [ -z "$APT_UPDATED" ]; then
    as_root apt-get update -qq >/dev/null || return 1
    APT_UPDATED=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >"$STATE_DIR/logs/apt.log" 2>&1
}

# --------------------------------------------------------------------------- 1. Python
pick_python() {
  local c
  for c in ${PYTHON:-} python3.11 python3.12 python3.13 python3; do
    if command -v "$c" >/dev/null 2>&1 \
      && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(pick_python) || die "Python >= 3.11 not found: install python3.11 (or set PYTHON=...)"
  say "python: creating .venv with $py"
  if ! "$py" -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv
    say "python: installing python3-venv"
    apt_install python3-venv || die "'$py -m venv' failed: install the venv module (python3-venv)"
    "$py" -m venv .venv
  fi
fi
stamp=.venv/.crucible-install-stamp
# torch first, pinned: an unpinned torch (or one pulled in by transformers) would be a
# multi-GB CUDA build. TORCH_SPEC picks another build (e.g. a CUDA wheel on a GPU machine).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# the extras the tests need: dev tools, the torch policy, TRL and an OpenAI-compatible server
EXTRAS=dev,torch,trl,serving
want=$( (cat pyproject.toml; echo "$TORCH_SPEC $EXTRAS") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && .venv/bin/python -c 'import service, torch' 2>/dev/null; then
  say "python: .venv up to date"
else
  say "python: pip install $TORCH_SPEC, then -e '.[$EXTRAS]' (log: $STATE_DIR/logs/pip.log)"
  if ! { .venv/bin/python -c 'import torch' 2>/dev/null \
           || .venv/bin/python -m pip install "$TORCH_SPEC"; } >"$STATE_DIR/logs/pip.log" 2>&1 \
     || ! .venv/bin/python -m pip install -e ".[$EXTRAS]" >>"$STATE_DIR/logs/pip.log" 2>&1; then
    tail -20 "$STATE_DIR/logs/pip.log" >&2
    die "pip install failed (full log: $STATE_DIR/logs/pip.log)"
  fi
  echo "$want" >"$stamp"
fi

# --------------------------------------------------------------------------- 2. Docker engine
engine_up() { .venv/bin/python -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }

if [ -n "${CRUCIBLE_DOCKER_HOST:-}" ]; then export DOCKER_HOST="$CRUCIBLE_DOCKER_HOST"; fi
if engine_up; then
  say "docker: engine reachable"
else
  if [ -n "${DOCKER_HOST:-}" ]; then
    die "docker: no engine answers at DOCKER_HOST=$DOCKER_HOST; start it or unset DOCKER_HOST"
  fi
  if [ -S /var/run/docker.sock ] && pgrep -x dockerd >/dev/null 2>&1; then
    die "docker: dockerd runs but /var/run/docker.sock refuses us: run as root or join the docker group"
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 \
      || die "docker: no engine and no apt-get: install Docker Engine (https://docs.docker.com/engine/install/) and start it, then rerun"
    say "docker: installing docker.io (apt-get)"
    apt_install docker.io \
      || die "docker: 'apt-get install docker.io' failed (needs root or sudo; log: $STATE_DIR/logs/apt.log)"
  fi
  if ! engine_up; then  # the package may have started it
    log=$PWD/$STATE_DIR/logs/dockerd.log
    say "docker: starting dockerd (log: $log)"
    as_root setsid nohup dockerd >"$log" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 60); do
      engine_up && break
      kill -0 "$pid" 2>/dev/null || { tail -5 "$log" >&2; die "docker: dockerd exited (log: $log)"; }
      sleep 0.5
    done
    engine_up || { tail -5 "$log" >&2; die "docker: dockerd did not answer within 30 s (log: $log)"; }
  fi
  say "docker: engine started"
fi

# --------------------------------------------------------------------------- 3. debootstrap
if [ -z "${BASE_IMAGE:-}${CRUCIBLE_BASE_IMAGE:-}" ] && ! command -v debootstrap >/dev/null 2>&1; then
  say "base image: installing debootstrap (apt-get)"
  apt_install debootstrap \
    || die "debootstrap is needed to build the base image: install it, or set BASE_IMAGE=debian:bookworm-slim"
fi
# --------------------------------------------------------------------------- 4. browser
# The dashboard's browser tests (tests/e2e) drive Debian's headless Chromium with selenium.
if ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
  if command -v apt-get >/dev/null 2>&1; then
    say "browser: installing chromium and chromium-driver (apt-get; for tests/e2e)"
    apt_install chromium chromium-driver \
      || say "browser: apt-get install chromium chromium-driver failed (log: $STATE_DIR/logs/apt.log); tests/e2e will fail"
  else
    say "browser: no apt-get: install Chromium and chromedriver for tests/e2e"
  fi
fi
say "ready"
