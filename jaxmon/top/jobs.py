"""`jaxmon top`'s job view: the processes of each training workload across the endpoints, and the slowest one.

A synchronous job runs at its slowest process's pace, and every process's step takes the slowest one's time, so
the slowest is the one whose devices wait most for its host (metrics.TRAINING_HOST_WAIT_SECONDS), as the
job rules of deploy/prometheus/job.yml judge it over a window in Prometheus.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from jaxmon.top.rows import Row


@dataclass(frozen=True)
class JobProcess:
    """One process of a workload: where it reports, and its training numbers."""

    workload: str
    process_index: str
    endpoint: str
    step: float | None
    dispatched: float | None
    step_time: float | None
    host_wait_ratio: float | None


@dataclass(frozen=True)
class Job:
    """A workload's processes, the slowest first, and which one that is (None: one process, or none stands out)."""

    workload: str
    processes: list[JobProcess]
    slowest: JobProcess | None

    @property
    def median_step_time(self) -> float | None:
        times = [p.step_time for p in self.processes if p.step_time is not None]
        return statistics.median(times) if times else None


def _key(p: JobProcess) -> tuple[float, str, str]:
    wait = p.host_wait_ratio if p.host_wait_ratio is not None else -1.0
    index = int(p.process_index) if p.process_index.isdigit() else 1 << 30
    return (-wait, f"{index:012d}", p.endpoint)


def jobs(rows: Iterable[Row]) -> list[Job]:
    """The workloads that step (jaxmon.step()), by name, each with its processes (one per endpoint and index)."""
    found: dict[str, dict[tuple[str, str], JobProcess]] = {}
    for r in rows:
        if r.process_index is None or r.endpoint_down is not None:
            continue
        process = JobProcess(
            r.key.workload, r.process_index, r.key.endpoint, r.step, r.dispatched, r.step_time, r.host_wait_ratio
        )
        found.setdefault(r.key.workload, {}).setdefault((r.key.endpoint, r.process_index), process)
    out = []
    for workload in sorted(found):
        processes = sorted(found[workload].values(), key=_key)
        out.append(Job(workload, processes, slowest(processes)))
    return out


def slowest(processes: list[JobProcess]) -> JobProcess | None:
    """The process whose devices waited most for its host, where it waited more than the job's median process
    (a job of one, or of equals, has none)."""
    known = [p for p in processes if p.host_wait_ratio is not None]
    if len(known) < 2:
        return None
    worst = max(known, key=lambda p: p.host_wait_ratio or 0.0)
    median = statistics.median(p.host_wait_ratio or 0.0 for p in known)
    return worst if (worst.host_wait_ratio or 0.0) > median else None
