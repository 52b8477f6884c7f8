"""Daemon CPU of one NVML poll of 8 GPUs, against the fake libnvidia-ml.so.1 of the tests (no GPU here).

    .venv/bin/python bench/nvml_poll.py          # about 10 seconds; needs gcc (builds tests/fakenvml)

A child process loads the fake through LD_LIBRARY_PATH exactly as the daemon does, builds the nvml collector and
runs `update()` 500 times (after 20 warm-up polls): every poll reads memory, utilization, power, limit,
temperature, SM clock, clocks event reasons, ECC mode and both ECC counts, and the process list of each of 8 GPUs
(two processes each), about 100 NVML calls through pynvml's ctypes. The figure is the CPU time of the polling
thread (`time.thread_time()`), median and p99 per poll; the Xid thread waits in its own thread and is not part of
a poll. Also timed: rendering the families of that state (what a scrape costs for these 8 GPUs).
The fake does a stat() of its scenario file per call, which a real driver does not: the figure includes that.
Target: <= 5 ms per poll.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median, save

sys.path.insert(0, str(ROOT))

from tests.fakenvml import Scenario, build, device

GPUS = 8
POLLS = 500
WARMUP = 20

CHILD = """
import json, statistics, time
from jaxmon.collectors.base import standalone_context
from jaxmon.snapshot import Snapshot
from jaxmon.collectors.nvml import NvmlCollector, NvmlOptions
from prometheus_client.exposition import generate_latest
from prometheus_client import CollectorRegistry

collector = NvmlCollector(NvmlOptions(), standalone_context(None))
polls, walls, renders = [], [], []
for i in range(WARMUP + POLLS):
    t0, w0 = time.thread_time(), time.perf_counter()
    update = collector.update()
    t1, w1 = time.thread_time(), time.perf_counter()
    assert update.success and len(update.state.gpus) == GPUS, update
    if i >= WARMUP:
        polls.append(t1 - t0)
        walls.append(w1 - w0)
        r0 = time.thread_time()
        families = [f for f in collector.families(Snapshot(), update.state) if f.samples]
        renders.append(time.thread_time() - r0)
series = sum(len(f.samples) for f in families)
collector.stop()
print(json.dumps({"cpu": polls, "wall": walls, "render": renders, "series": series}))
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        devices = [
            device(i, processes=[{"pid": 1000 + i, "used": 1 << 30}, {"pid": 2000 + i, "used": 2 << 30}])
            for i in range(GPUS)
        ]
        scenario = Scenario(Path(tmp) / "scenario.json", devices)
        build()
        code = CHILD.replace("WARMUP", str(WARMUP)).replace("POLLS", str(POLLS)).replace("GPUS", str(GPUS))
        started = time.time()
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**scenario.env(), "PATH": "/usr/bin:/bin"},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    cpu, wall, render = sorted(data["cpu"]), sorted(data["wall"]), sorted(data["render"])
    result = {
        "gpus": GPUS,
        "polls": POLLS,
        "poll_cpu_ms": {
            "median": median(cpu) * 1e3,
            "p99": cpu[int(0.99 * len(cpu))] * 1e3,
            "mean": statistics.fmean(cpu) * 1e3,
        },
        "poll_wall_ms": {"median": median(wall) * 1e3, "p99": wall[int(0.99 * len(wall))] * 1e3},
        "render_cpu_ms": {"median": median(render) * 1e3},
        "series": data["series"],
        "target_ms": 5.0,
        "started": started,
    }
    save("nvml_poll", result)


if __name__ == "__main__":
    main()
