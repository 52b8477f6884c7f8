#!/usr/bin/env bash
# Install everything the suite needs and run it: lint, format, types, tests (unit, then end-to-end).
# Used by the README's test command and by CI (.ci/run).
#
#   bash tests/run.sh           the whole suite, as CI runs it (installs Debian packages and the venv)
#   bash tests/run.sh --unit    the unit tests only (tests/unit, not tests/integration): makes or updates the venv
#                               when pyproject.toml changed, no apt-get, no lint; the fast loop while writing code
#
# The whole suite ends with tests/floors.sh: the unit tests again in a venv of their own (.venv-floors) with every
# runtime dependency at its declared floor (the venv is made beside pytest; its tests take 30-50 s).
#
# Arguments after these go to pytest, e.g. `bash tests/run.sh --unit -k spool -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# Bytecode caches on, where the shell turned them off (this machine's shells set PYTHONDONTWRITEBYTECODE=1): pytest
# keeps each test module's rewritten asserts in __pycache__ (gitignored) and Python each module it compiled, so a
# worker collects the unit tests in about half the time from the second run on (11.6-17 s against 21.5 s for
# `--collect-only tests/unit`, one process on a loaded machine), and the floors' run reads what the suite's wrote.
export PYTHONDONTWRITEBYTECODE=
# The venv, installed from this checkout with the test extra; the stamp records which pyproject.toml it was for.
STAMP=.venv/.jaxmon-test-install
install_venv() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[test]'
  sha256sum pyproject.toml >"$STAMP"
}
# The hundreds of child processes the tests start (daemons, workloads, scripts) import jaxmon from this checkout,
# whose modules the editable install leaves uncompiled: where PYTHONDONTWRITEBYTECODE is set (this machine's shells
# set it), each child compiled them from source again (0.4 s of CPU for the whole package), and each unit worker
# (about 1 s of its collection from a fresh clone). Compiled once, they read the .pyc (each checked against its
# source's mtime: an edited file is compiled again); the test modules' rewritten asserts are pytest's own.
compile_checkout() {
  .venv/bin/python -m compileall -q -j 2 jaxmon tests >/dev/null
}

if [ "${1:-}" = "--unit" ]; then
  shift
  if ! [ -x .venv/bin/python ] || ! sha256sum --check --status "$STAMP" 2>/dev/null; then
    install_venv
  fi
  compile_checkout
  # worksteal: a worker that runs out of tests takes half of the other's (xdist's `load` left one idle for the last
  # 11 s of 54 beside other work on the machine).
  JAX_NUM_CPU_DEVICES=8 exec .venv/bin/python -m pytest tests/unit -n 2 --dist worksteal "$@"
fi

# Debian packages, installed when missing:
# - prometheus: promtool lints the exposition; later tests also run a real Prometheus. The package starts a
#   Prometheus service where systemd runs; the tests start their own on loopback.
# - prometheus-alertmanager: amtool checks deploy/alertmanager/alertmanager.yml, and tests/e2e/test_alertmanager.py
#   runs a real Alertmanager behind a real Prometheus (on loopback, like the Prometheus).
# - tmux: the `jaxmon top` tests run it in a real terminal and read the screen.
# - gcc and the C headers build tests/fakenvml/fakenvml.c, the fake libnvidia-ml.so.1 the NVML tests load.
# - podman and runc build and run the image in tests/e2e/test_container.py (docker instead where a daemon answers);
#   mmdebstrap and eatmydata make its base image where Docker Hub cannot be reached.
#   podman's recommended packages are needed too (container networking: containernetworking-plugins).
need=() engine=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
{ command -v gcc >/dev/null 2>&1 && [ -e /usr/include/stdio.h ]; } || need+=(gcc libc6-dev)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v eatmydata >/dev/null 2>&1 || need+=(eatmydata)
command -v podman >/dev/null 2>&1 || engine+=(podman)
command -v runc >/dev/null 2>&1 || engine+=(runc)
# - docker.io (dockerd) and docker-compose: tests/e2e/test_container_engines.py runs the image on a private Docker
#   daemon as well (root only) and the compose demo with Docker's own docker-compose.
{ [ -x /usr/sbin/dockerd ] || command -v dockerd >/dev/null 2>&1; } || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if [ "${#need[@]}" -gt 0 ] || [ "${#engine[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  export DEBIAN_FRONTEND=noninteractive
  [ "${#need[@]}" -eq 0 ] || $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ "${#engine[@]}" -eq 0 ] || $SUDO apt-get install -y -qq "${engine[@]}" >/dev/null
fi

install_venv
compile_checkout

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy and the floors' venv (tests/floors.sh --prepare) run beside pytest: both are CPU for a minute or so, and
# pytest's end-to-end tests spend much of their time waiting (for Prometheus' rule windows, for children). Their
# output comes after pytest's; a failure of either fails the run.
logs=$(mktemp -d)
.venv/bin/mypy >"$logs/mypy" 2>&1 &
mypy_pid=$!
bash tests/floors.sh --prepare >"$logs/floors-venv" 2>&1 &
floors_pid=$!
# pyproject.toml's testpaths (tests/unit, tests/integration and tests/e2e) on two workers, each file a group run on
# one worker; the longest end-to-end files (tests/conftest.py's LONG_LANE) are one group, started first. `-n 0` runs
# them all in one process.
tests=0
JAX_NUM_CPU_DEVICES=8 .venv/bin/python -m pytest -n 2 --dist loadfile "$@" || tests=$?
types=0
wait $mypy_pid || types=$?
cat "$logs/mypy"
if [ "$tests" -ne 0 ] || [ "$types" -ne 0 ]; then
  kill $floors_pid 2>/dev/null || true
  exit $((tests ? tests : types))
fi
wait $floors_pid || { status=$?; cat "$logs/floors-venv"; exit "$status"; }
# Every runtime dependency at its `>=` floor in pyproject.toml, the unit suite again (tests/floors.sh).
bash tests/floors.sh -q
