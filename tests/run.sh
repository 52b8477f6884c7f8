#!/usr/bin/env bash
# Install everything the suite needs and run it: lint, format, types, tests.
# Used by the README's test command and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

MISSING=()
# promtool (Debian package 'prometheus') lints the exposition; later tests also run a real Prometheus.
command -v promtool >/dev/null 2>&1 || MISSING+=(prometheus)
# tmux: the `jaxmon top` tests run it in a real terminal and read the screen.
command -v tmux >/dev/null 2>&1 || MISSING+=(tmux)
# gcc and the C headers build tests/fakenvml/fakenvml.c, the fake libnvidia-ml.so.1 the NVML tests load.
{ command -v gcc >/dev/null 2>&1 && [ -e /usr/include/stdio.h ]; } || MISSING+=(gcc libc6-dev)
if [ ${#MISSING[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${MISSING[@]}" >/dev/null
fi
# The Debian package starts a Prometheus service where systemd runs; the tests start their own on loopback.

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
JAX_NUM_CPU_DEVICES=8 .venv/bin/python -m pytest "$@"
