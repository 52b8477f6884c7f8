#!/usr/bin/env bash
# The unit suite with every runtime dependency at its declared floor: a venv of its own (.venv-floors) where each
# `>=` of pyproject.toml's dependencies and runtime extras is pinned `==` (tests/floors.py reads them from
# pyproject.toml), the test extra's tools unpinned, then `pytest tests/unit`. tests/run.sh runs it after the suite,
# so CI does. A floor the code outgrows fails here, not in a trainer's environment that pins an old version.
#
#   bash tests/floors.sh [pytest arguments]
#   bash tests/floors.sh --prepare      make or update the venv only (tests/run.sh does it beside the main run)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv-floors
STAMP=$VENV/.jaxmon-floors-install
if ! [ -x $VENV/bin/python ] || ! sha256sum --check --status "$STAMP" 2>/dev/null; then
  [ -x $VENV/bin/python ] || "$PY" -m venv $VENV
  "$PY" tests/floors.py constraints >$VENV/constraints.txt
  "$PY" tests/floors.py requirements >$VENV/requirements.txt
  $VENV/bin/python -m pip install -q --upgrade pip >/dev/null
  $VENV/bin/python -m pip install -q -c $VENV/constraints.txt -e '.[serve,top]' -r $VENV/requirements.txt
  sha256sum pyproject.toml tests/floors.py >"$STAMP"
fi
if [ "${1:-}" = "--prepare" ]; then exit 0; fi
$VENV/bin/python tests/floors.py check
JAX_NUM_CPU_DEVICES=8 exec $VENV/bin/python -m pytest tests/unit -n 2 --dist worksteal "$@"  # as tests/run.sh --unit
