#!/usr/bin/env bash
# GPU facts for jaxmon, on a machine with an NVIDIA GPU where JAX with CUDA is installed (pip install -e '.[cuda]').
#
#   bash bench/gpu.sh [OUT_DIR]        # under 8 minutes; default OUT_DIR bench/results/gpu-<host>-<UTC time>
#
# Records, into OUT_DIR:
#   env.txt, nvidia-smi.txt                 the machine, driver, GPU, Python and JAX versions
#   replay-<setting>.json                   real memory_stats() dicts of every GPU, one per stage (fresh, after
#                                           8 x 64 MiB, after freeing every other one, after 1 GiB, after freeing
#                                           it, after a 4096^2 matmul), in the replay format (docs/replay.md):
#                                           ready to copy into tests/fixtures; replay-<setting>.meta.json names the
#                                           stages and the environment; snapshot-<setting>.json is jaxmon's numbers
#                                           for each stage (free, fragmentation, largest allocatable)
#     settings: default (BFC, preallocates 75 %), prealloc-false (XLA_PYTHON_CLIENT_PREALLOCATE=false),
#     sidecar (prealloc false + XLA_CLIENT_MEM_FRACTION=0.02, what `jaxmon serve` sets), platform, cuda_async
#     and vmm (XLA_PYTHON_CLIENT_ALLOCATOR=...; names from jaxlib/xla_client.py generate_pjrt_gpu_plugin_options)
#   run.log                                 what ran, when, and the headline numbers
#   sidecar.log, sidecar-metrics.prom       `jaxmon serve` on the GPU at the sidecar defaults: the probe's
#                                           calibration (steps, baseline, footprint, FLOP/s) and its own allocator
#   sidecar-gpu-memory.csv                  the sidecar's own GPU memory (nvidia-smi --query-compute-apps), i.e. its
#                                           CUDA context + 2 % pool + probe
#   utilization.json, nvidia-smi-util.csv   jaxmon_device_utilization_ratio against an induced load of known duty
#                                           cycle (0, 50, 100 % of a 200 ms period, 4096^2 float32 matmuls on GPU 0)
#                                           with nvidia-smi's utilization.gpu sampled every 500 ms beside it
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${1:-bench/results/gpu-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$SECONDS
log() { echo "[gpu.sh +$((SECONDS - START))s] $*" | tee -a "$OUT/run.log"; }
# The whole run stays under 8 minutes: a step that could not finish in the time left is skipped (and logged).
have_time() { [ $((SECONDS - START + $1)) -le 470 ] || { log "skipped: $2 (not enough time left)"; return 1; }; }

# -- 0. the machine ----------------------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu.sh: nvidia-smi not found: this script needs an NVIDIA GPU" >&2
  exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo
  free -h | sed -n 2p
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv
  "$PY" - <<'EOF'
import platform, jax, jaxlib
print("python", platform.python_version(), "jax", jax.__version__, "jaxlib", jaxlib.__version__)
print("devices", jax.devices())
try:
    import jaxmon
    print("jaxmon", jaxmon.__file__)
except ImportError as exc:
    print("jaxmon not importable:", exc)
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if ! timeout 60 "$PY" -c "import jax, sys; sys.exit(0 if jax.devices('gpu') else 1)" >/dev/null 2>&1; then
  echo "gpu.sh: JAX sees no GPU (is jax[cuda12] installed?); see $OUT/env.txt" >&2
  exit 2
fi
NGPU=$(nvidia-smi -L | wc -l)
log "GPUs: $NGPU; output: $OUT"

# -- 1. memory_stats() per allocator setting --------------------------------------------------------------------
RECORD=$(cat <<'EOF'
import json, os, sys
import numpy as np
import jax

setting, out = sys.argv[1], sys.argv[2]
devs = jax.devices("gpu")
d0 = devs[0]
stages, snaps = [], []

def record(name):
    jax.effects_barrier()
    stages.append(name)
    snaps.append([d.memory_stats() for d in devs])

record("fresh")
held = [jax.device_put(np.ones((64 << 20) // 4, np.float32), d0) for _ in range(8)]
jax.block_until_ready(held)
record("after_8x64MiB")
del held[1::2]
record("after_freeing_every_other")
big = jax.device_put(np.ones((1 << 30) // 4, np.float32), d0)
big.block_until_ready()
record("after_1GiB")
del big
record("after_freeing_1GiB")
x = jax.device_put(np.ones((4096, 4096), np.float32), d0)
jax.jit(lambda a: (a @ a.T).sum())(x).block_until_ready()
record("after_matmul_4096")

devices = []
for i, d in enumerate(devs):
    per_stage = [s[i] for s in snaps]
    entry = {"id": int(d.id), "platform": "gpu", "device_kind": str(d.device_kind), "process_index": int(d.process_index)}
    if all(s is None for s in per_stage):
        entry["memory_stats"] = None
    else:
        entry["memory_stats"] = [{k: v for k, v in (s or {}).items()} for s in per_stage]
    devices.append(entry)
with open(os.path.join(out, f"replay-{setting}.json"), "w") as fh:
    json.dump({"devices": devices}, fh, indent=1)
env = {k: v for k, v in os.environ.items() if k.startswith("XLA_") or k.startswith("JAX_")}
with open(os.path.join(out, f"replay-{setting}.meta.json"), "w") as fh:
    json.dump({"setting": setting, "stages": stages, "env": env, "jax": jax.__version__}, fh, indent=1)
print(setting, "device 0:", json.dumps(snaps[-1][0]))
EOF
)

# jaxmon's numbers for every recorded stage (and a check that the file loads as a replay file).
NUMBERS=$(cat <<'EOF'
import json, sys
from pathlib import Path
from jaxmon.memory import memory_numbers
from jaxmon.sources.replay import load_replay

load_replay(Path(sys.argv[1]))
out = {}
for d in json.loads(Path(sys.argv[1]).read_text())["devices"]:
    stats = d.get("memory_stats")
    entries = stats if isinstance(stats, list) else [stats]
    out[f"{d['platform']}:{d['id']}"] = [memory_numbers(e).as_dict() for e in entries]
print(json.dumps(out, indent=1))
EOF
)

record_setting() {
  local name=$1; shift
  have_time 80 "memory_stats: $name" || return 0
  log "memory_stats: $name ($*)"
  if env -u XLA_PYTHON_CLIENT_PREALLOCATE -u XLA_CLIENT_MEM_FRACTION -u XLA_PYTHON_CLIENT_MEM_FRACTION \
       -u XLA_PYTHON_CLIENT_ALLOCATOR "$@" timeout 45 "$PY" -c "$RECORD" "$name" "$OUT" \
       >> "$OUT/record-$name.log" 2>&1; then
    timeout 30 "$PY" -c "$NUMBERS" "$OUT/replay-$name.json" > "$OUT/snapshot-$name.json" \
      2>> "$OUT/record-$name.log" || log "  jaxmon could not read replay-$name.json"
  else
    log "  $name failed (see record-$name.log)"
  fi
}
record_setting default
record_setting prealloc-false XLA_PYTHON_CLIENT_PREALLOCATE=false
record_setting sidecar XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_CLIENT_MEM_FRACTION=0.02
record_setting platform XLA_PYTHON_CLIENT_ALLOCATOR=platform
record_setting cuda_async XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async
record_setting vmm XLA_PYTHON_CLIENT_ALLOCATOR=vmm

# -- 2. the sidecar on the GPU: probe calibration and its own GPU memory ----------------------------------------
SIDECAR_OK=1
have_time 75 "sidecar" || SIDECAR_OK=0
PORT=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
if [ "$SIDECAR_OK" = 1 ]; then
log "sidecar: jaxmon serve on 127.0.0.1:$PORT (sidecar defaults, probe every 2 s)"
env -u XLA_PYTHON_CLIENT_PREALLOCATE -u XLA_CLIENT_MEM_FRACTION -u XLA_PYTHON_CLIENT_MEM_FRACTION \
  -u XLA_PYTHON_CLIENT_ALLOCATOR timeout 75 "$PY" -m jaxmon serve --web.listen-address "127.0.0.1:$PORT" \
  --collector.probe.interval 2s --log.format json > "$OUT/sidecar.log" 2>&1 &
SIDECAR=$!  # timeout's pid; the daemon is its child
sleep 1
SIDECAR_PY=$(ps -o pid= --ppid "$SIDECAR" | tr -d ' ' | head -n 1)
for _ in $(seq 1 600); do
  if curl -fs "http://127.0.0.1:$PORT/metrics" -o "$OUT/sidecar-metrics.prom" 2>/dev/null \
     && [ "$(grep -c '^jaxmon_probe_steps{.*platform="gpu"' "$OUT/sidecar-metrics.prom")" -ge "$NGPU" ]; then
    break
  fi
  kill -0 "$SIDECAR" 2>/dev/null || break
  sleep 0.1
done
sleep 5  # a few probe runs after calibration
curl -fs "http://127.0.0.1:$PORT/metrics" -o "$OUT/sidecar-metrics.prom" || log "  sidecar did not answer"
{
  echo "sidecar_pid,$SIDECAR_PY"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
} > "$OUT/sidecar-gpu-memory.csv" 2>&1
grep -E '^jaxmon_probe_(steps|baseline_seconds|duration_seconds|flops_per_second|memory_bytes)\{.*gpu' \
  "$OUT/sidecar-metrics.prom" | tee -a "$OUT/run.log"
grep -E "^(pid|${SIDECAR_PY:-none})," "$OUT/sidecar-gpu-memory.csv" | tee -a "$OUT/run.log"
kill "$SIDECAR" 2>/dev/null
wait "$SIDECAR" 2>/dev/null
fi

# -- 3. utilization estimate against an induced load of known duty cycle ----------------------------------------
if have_time 170 "utilization"; then
log "utilization: induced load 0 / 50 / 100 % on GPU 0"
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -lms 500 \
  > "$OUT/nvidia-smi-util.csv" 2>&1 &
SMI=$!
JAXMON_BENCH_RESULTS="$OUT" timeout 170 "$PY" bench/utilization.py --platform gpu --size 4096 --load-devices 1 \
  --passes 1 --window 20 --probe-interval 0.5s > "$OUT/utilization.log" 2>&1 \
  || log "  utilization run failed (see utilization.log)"
kill "$SMI" 2>/dev/null
wait "$SMI" 2>/dev/null
grep -E '^(induced|level)' "$OUT/utilization.log" | tee -a "$OUT/run.log"
fi

log "done in $((SECONDS - START)) s; results in $OUT"
echo "To keep the recorded dicts as fixtures: cp $OUT/replay-*.json $ROOT/tests/fixtures/ (and commit with the note)."
