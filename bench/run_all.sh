#!/usr/bin/env bash
# Every CPU figure of BENCHMARKS.md, one after the other (about 38 minutes; 48 with --soak).
#
#   bash bench/run_all.sh [--soak]
#   NVITOP_EXPORTER=/tmp/nvx/bin/nvitop-exporter bash bench/run_all.sh   # adds node_weight.py (10 more minutes)
#
# Each script also runs on its own (the command is at the top of each and in BENCHMARKS.md) and writes
# bench/results/NAME.json with the machine and the date. Run on a quiet machine: the scripts measure side by side
# and take medians, but every figure is a time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
for script in scrape_throughput scrape_cost train_step probe_duty probe_memory daemon_cpu daemon_rss readyz utilization nvml_poll tpu_poll spool_scale tracker_poll step_call program_analysis; do
  echo "== bench/$script.py"
  "$PY" "bench/$script.py"
done
# nvitop-exporter lives in a venv of its own (python3 -m venv /tmp/nvx && /tmp/nvx/bin/pip install nvitop-exporter).
if [ -n "${NVITOP_EXPORTER:-}" ]; then
  echo "== bench/node_weight.py"
  "$PY" bench/node_weight.py --nvitop "$NVITOP_EXPORTER" --kubernetes
fi
if [ "${1:-}" = "--soak" ]; then
  echo "== bench/soak.py"
  "$PY" bench/soak.py
fi
