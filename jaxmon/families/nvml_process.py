"""The nvml collector's per-process utilization families: which process of a shared (time-sliced, MPS) GPU uses it,
labelled as each process's device memory (the GPU's labels, pid, workload) and bounded by
--collector.nvml.max-processes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import Metric

from jaxmon.catalog import metrics
from jaxmon.catalog.metrics import Family
from jaxmon.families import add
from jaxmon.sources.nvml import GpuReading, MigDevice, ProcessUtilization

Labels = Callable[[GpuReading, MigDevice | None], dict[str, str]]

# Per-process utilization (nvmlDeviceGetProcessesUtilizationInfo / nvmlDeviceGetProcessUtilization): (family,
# ProcessUtilization attribute), labelled as each process's device memory (the GPU's labels, pid, workload).
PROCESS_UTILIZATION: tuple[tuple[Family, str], ...] = (
    (
        metrics.PROCESS_SM_UTILIZATION_RATIO,
        "sm",
    ),
    (
        metrics.PROCESS_MEMORY_BANDWIDTH_UTILIZATION_RATIO,
        "memory",
    ),
    (
        metrics.PROCESS_ENCODER_UTILIZATION_RATIO,
        "encoder",
    ),
    (
        metrics.PROCESS_DECODER_UTILIZATION_RATIO,
        "decoder",
    ),
)


def busiest(processes: Iterable[ProcessUtilization], bound: int) -> list[ProcessUtilization]:
    """The `bound` processes with the most SM use (then memory bandwidth, then the lower pid): on a shared GPU the
    question is who uses it, which a process's memory does not answer (a small server may take most of the SMs)."""
    return sorted(processes, key=lambda p: (-p.sm, -p.memory, p.pid))[:bound]


def process_utilization(
    gpus: Iterable[GpuReading],
    labels: Labels,
    workloads: Mapping[int, str],
    bound: int,
) -> Iterator[Metric]:
    """Each GPU's `bound` busiest processes' utilization (a pid is a new series: bounded as the process memory is);
    GPUs without per-process utilization (MIG, an old driver: None) give none."""
    families = [(spec.new(), attr) for spec, attr in PROCESS_UTILIZATION]
    for gpu in gpus:
        for proc in busiest(gpu.process_utilization or (), bound):
            own = {**labels(gpu, None), "pid": str(proc.pid)}
            if proc.pid in workloads:
                own["workload"] = workloads[proc.pid]
            for fam, attr in families:
                add(fam, own, getattr(proc, attr))
    for fam, _ in families:
        yield fam
