#!/usr/bin/env bash
# TPU facts for jaxmon, on a machine with a TPU where JAX with libtpu is installed. Uses no socket.
#
#   bash bench/tpu.sh [OUT_DIR] [--dry-run]   # under 8 minutes; default OUT_DIR bench/results/tpu-<host>-<UTC time>
#
# --dry-run runs every stage with small sizes on the devices JAX has (CPU without a TPU), to test the script first.
# Records, into OUT_DIR (bench/tpu.py does the first seven, in one process that holds the chip):
#   env.json                      the machine, Python, JAX, jaxlib, libtpu, tpu-info and jaxmon versions, the devices
#   replay-stages.json            real memory_stats() of every local device at five stages, in the replay format
#                                 (docs/replay.md; a list per device, one entry per stage): fresh, after 8 x 64 MiB
#                                 arrays, after freeing every other one, after a program with an 805 MiB temporary
#                                 (outer product of 14336 floats), after freeing everything; replay-<stage>.json is
#                                 the first device at one stage (a fixture of one shape); replay-stages.meta.json
#                                 names the stages and the program's memory_analysis()
#   embedded-after-loop.prom      jaxmon.start()'s exposition after a tracked bf16 MLP loop (B=8192, D=4096, 4 layers,
#                                 value_and_grad + SGD, donated; 900 steps; sampled traces every 40), rendered in-process
#   truth.json, compare.json      the loop's own truth (step time from its wall clock, HFU from XLA's FLOPs and the
#                                 chip's peak, memory_analysis(), memory_stats()) and jaxmon's figures beside it
#   sdk.json                      libtpu's monitoring SDK as jaxmon's SDK child (the daemon's reader) reads it, every
#                                 second through the loop: statuses, every metric's strings, read times, child RSS
#   trace-3steps.xplane.pb        one jax.profiler trace of 3 steps, and trace-split.json, jaxmon's split of it
#   step-cost/                    bench/step_cost.py's per-step cost at three step lengths, where that script exists
#   run.log                       what ran, when, and the headline numbers
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
DRY=()
OUT=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=(--dry-run) ;;
    *) OUT=$arg ;;
  esac
done
OUT=${OUT:-bench/results/tpu-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$SECONDS
log() { echo "[tpu.sh +$((SECONDS - START))s] $*" | tee -a "$OUT/run.log"; }
export BENCH_REVISION=${BENCH_REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

log "bench/tpu.py into $OUT ${DRY[*]}"
timeout 330 "$PY" bench/tpu.py "$OUT" "${DRY[@]}" 2> "$OUT/tpu.py.stderr"
rc=$?
[ "$rc" -eq 0 ] || log "bench/tpu.py exited with $rc (stderr in tpu.py.stderr)"

# The step-cost ratios (the step-cost issue's bench), at three step lengths, where the script exists.
if [ -f bench/step_cost.py ]; then
  left=$((470 - (SECONDS - START)))
  if [ "$left" -gt 60 ]; then
    log "bench/step_cost.py (${left}s left)"
    mkdir -p "$OUT/step-cost"
    timeout "$left" "$PY" bench/step_cost.py --platform tpu --sizes 1,0.36 --alternations 3 \
      --out "$OUT/step-cost/step_cost.json" > "$OUT/step-cost/stdout.txt" 2>&1 \
      || log "bench/step_cost.py exited with $? (output in step-cost/stdout.txt)"
  else
    log "skipped: bench/step_cost.py (not enough time left)"
  fi
else
  log "skipped: bench/step_cost.py is not in this tree (the step-cost issue's bench); no step-cost ratios recorded"
fi
log "done in $((SECONDS - START))s"
