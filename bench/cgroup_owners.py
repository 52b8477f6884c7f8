"""CPU of the pid -> owner reads of one poll: 16 processes on 8 GPUs, the slurm collector's `update()`.

    .venv/bin/python bench/cgroup_owners.py        # about 10 seconds; as root, the processes in real Slurm cgroups

16 real child processes (`sleep`), two per GPU of an NVML state of 8 GPUs, offered through the exchange as the nvml
collector offers it; where this machine lets the bench make cgroup v2 cgroups (root, tests/cgroup_tree.py), each
child sits in a Slurm step's cgroup (`system.slice/slurmstepd.scope/job_J/step_0/user/task_0`, one job per GPU, under
a directory of the bench's own, removed after), so every read parses a job and reads the uid from
/proc/<pid>/status. The figure is the process's CPU time over each `update()` (`time.process_time()`), median and
p99 over POLLS polls:

- steady: what each poll costs once the processes are known (one /proc/<pid>/stat read per process, for its start
  time: a reused pid is read afresh);
- cold: every process new at every poll (the cache emptied before each): stat, cgroup, status, stat again.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from common import ROOT, median, save

sys.path.insert(0, str(ROOT))

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.nvml import NvmlCollector, NvmlState
from jaxmon.collectors.slurm import SlurmCollector, SlurmOptions
from jaxmon.exchange import GPU_PROCESSES
from jaxmon.snapshot import Snapshot
from jaxmon.sources.node import NodeSource
from jaxmon.sources.nvml import GpuReading, Process
from tests.cgroup_tree import Cgroups, hierarchy, usable

GPUS = 8
PER_GPU = 2
POLLS = 500
WARMUP = 20


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def run(collector: SlurmCollector, cold: bool) -> list[float]:
    out = []
    for i in range(WARMUP + POLLS):
        if cold:
            collector._owners._cache.clear()
        p0 = time.process_time()
        update = collector.update()
        p1 = time.process_time()
        if i >= WARMUP:
            out.append(p1 - p0)
    assert update.success
    return out


def main() -> None:
    mount = hierarchy()
    why = usable(mount)
    cgroups = Cgroups(mount) if why is None and mount is not None else None
    children = []
    try:
        for gpu in range(GPUS):
            for _ in range(PER_GPU):
                if cgroups is not None:
                    children.append(cgroups.spawn(f"system.slice/slurmstepd.scope/job_{100 + gpu}/step_0/user/task_0"))
                else:
                    children.append(subprocess.Popen(["sleep", "600"]))
        pids = [c.pid for c in children]
        gpus = tuple(
            GpuReading(index=g, uuid=f"GPU-{g}", processes=tuple(Process(p, 1 << 30) for p in pids[2 * g : 2 * g + 2]))
            for g in range(GPUS)
        )
        snap = Snapshot(states={"nvml": NvmlState(gpus=gpus)})
        ctx = standalone_context(NodeSource(), snapshot=lambda: snap)
        ctx.exchange.offer(GPU_PROCESSES, "nvml", NvmlCollector.offers[GPU_PROCESSES])
        collector = SlurmCollector(SlurmOptions(enabled=True), replace(ctx, procfs=Path("/proc")))
        jobs = collector.update().state.devices
        steady, cold = [], []
        for _ in range(3):  # alternating, so that the machine's load falls on both alike
            steady += run(collector, cold=False)
            cold += run(collector, cold=True)
    finally:
        for c in children:
            c.kill()
            c.wait()
        if cgroups is not None:
            cgroups.close()
    ms = 1000.0
    save(
        "cgroup_owners",
        {
            "processes": len(pids),
            "gpus": GPUS,
            "real_slurm_cgroups": cgroups is not None,
            "why_not_real_cgroups": why,
            "job_device_series": len(jobs),
            "polls_per_side": len(steady),
            "steady_cpu_ms_median": round(median(steady) * ms, 4),
            "steady_cpu_ms_p99": round(p99(steady) * ms, 4),
            "cold_cpu_ms_median": round(median(cold) * ms, 4),
            "cold_cpu_ms_p99": round(p99(cold) * ms, 4),
            "command": ".venv/bin/python bench/cgroup_owners.py",
        },
    )


if __name__ == "__main__":
    main()
