"""The nvml collector's per-GPU families, one family per NVML reading, rendered with the labels the collector makes;
and the per-process utilization families: which process of a shared (time-sliced, MPS) GPU uses it.

Every series here gets its labels from `labels(gpu, mig)`, the collector's one label function (`_labels` in
jaxmon/collectors/nvml.py), plus what names the series within the GPU (`reason`, `kind`, `fan`, `direction`,
`link`). A number NVML did not report (None in the reading) is an absent series.

Series a fleet can afford: NVLink traffic and errors are per GPU unless --collector.nvml.nvlink-links (18 links x 6
counters is 108 series per H200), and the per-pid process memory (jaxmon/collectors/nvml.py) and utilization
(`process_utilization`) are bounded by --collector.nvml.max-processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from jaxmon.catalog import metrics
from jaxmon.catalog.metrics import Family
from jaxmon.families import add
from jaxmon.sources.nvml import (
    CLOCKS_EVENT_REASONS,
    GPM_METRICS,
    GpuReading,
    MigDevice,
    NvLink,
    ProcessUtilization,
)

Labels = Callable[[GpuReading, MigDevice | None], dict[str, str]]

# One series per GPU: (family, GpuReading attribute).
GPU_VALUES: tuple[tuple[Family, str], ...] = (
    (metrics.DEVICE_MEMORY_TOTAL_BYTES, "memory_total_bytes"),
    (metrics.DEVICE_MEMORY_USED_BYTES, "memory_used_bytes"),
    (metrics.DEVICE_DUTY_CYCLE_RATIO, "duty_cycle_ratio"),
    (metrics.DEVICE_MEMORY_BANDWIDTH_UTILIZATION_RATIO, "memory_bandwidth_utilization_ratio"),
    (
        metrics.DEVICE_ENCODER_UTILIZATION_RATIO,
        "encoder_utilization_ratio",
    ),
    (
        metrics.DEVICE_DECODER_UTILIZATION_RATIO,
        "decoder_utilization_ratio",
    ),
    (metrics.DEVICE_POWER_WATTS, "power_watts"),
    (metrics.DEVICE_POWER_LIMIT_WATTS, "power_limit_watts"),
    (
        metrics.DEVICE_POWER_MANAGEMENT_LIMIT_WATTS,
        "power_management_limit_watts",
    ),
    (
        metrics.DEVICE_ENERGY_JOULES,
        "energy_joules_total",
    ),
    (metrics.DEVICE_TEMPERATURE_CELSIUS, "temperature_celsius"),
    (metrics.DEVICE_GRAPHICS_CLOCK_HERTZ, "graphics_clock_hertz"),
    (metrics.DEVICE_SM_CLOCK_HERTZ, "sm_clock_hertz"),
    (metrics.DEVICE_MEMORY_CLOCK_HERTZ, "memory_clock_hertz"),
    (metrics.DEVICE_VIDEO_CLOCK_HERTZ, "video_clock_hertz"),
    (
        metrics.DEVICE_GRAPHICS_CLOCK_MAX_HERTZ,
        "graphics_clock_max_hertz",
    ),
    (metrics.DEVICE_SM_CLOCK_MAX_HERTZ, "sm_clock_max_hertz"),
    (
        metrics.DEVICE_MEMORY_CLOCK_MAX_HERTZ,
        "memory_clock_max_hertz",
    ),
    (metrics.DEVICE_VIDEO_CLOCK_MAX_HERTZ, "video_clock_max_hertz"),
    (
        metrics.DEVICE_PCIE_REPLAYS,
        "pcie_replays_total",
    ),
)


@dataclass(frozen=True)
class NvLinkTotals:
    """One GPU's NVLink counters summed over its links: bytes by direction, errors by kind (a counter no link
    reported is absent)."""

    bytes: Mapping[str, int] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)


def sum_links(links: Iterable[NvLink]) -> NvLinkTotals:
    """The sums of `links`' counters (each link's last reading while it was active: an inactive one has none)."""
    sent: dict[str, int] = {}
    errors: dict[str, int] = {}
    for link in links:
        for direction, value in (("tx", link.tx_bytes_total), ("rx", link.rx_bytes_total)):
            if value is not None:
                sent[direction] = sent.get(direction, 0) + value
        for kind, count in link.errors().items():
            errors[kind] = errors.get(kind, 0) + count
    return NvLinkTotals(sent, errors)


def gpu_families(
    gpus: Sequence[GpuReading],
    labels: Labels,
    nvlink_totals: Mapping[int, NvLinkTotals] | None = None,
    nvlink_links: bool = False,
    gpm_pipes: bool = False,
) -> Iterator[Metric]:
    """Every per-GPU family of the GPUs that answered this poll. NVLink traffic and errors are per GPU, from
    `nvlink_totals` by NVML index (else the sums of the links active now), or per link with `nvlink_links`; GPM's
    per-pipe activity only with `gpm_pipes`."""
    for spec, attr in GPU_VALUES:
        fam = spec.new()
        for gpu in gpus:
            value = getattr(gpu, attr)
            if value is not None:
                add(fam, labels(gpu, None), value)
        yield fam
    yield from _throttle_and_memory_errors(gpus, labels)
    yield from _fans_and_pcie(gpus, labels)
    yield from _nvlink(gpus, labels, nvlink_totals or {}, nvlink_links)
    yield from _mig(gpus, labels)
    yield from _gpm(gpus, labels, gpm_pipes)


def _throttle_and_memory_errors(gpus: Iterable[GpuReading], labels: Labels) -> Iterator[Metric]:
    throttled, ecc = metrics.DEVICE_THROTTLED.new(), metrics.DEVICE_ECC_ERRORS.new()
    rows, pending, failed = (
        metrics.DEVICE_REMAPPED_ROWS.new(),
        metrics.DEVICE_ROW_REMAPPING_PENDING.new(),
        metrics.DEVICE_ROW_REMAPPING_FAILED.new(),
    )
    for gpu in gpus:
        own = labels(gpu, None)
        if gpu.clocks_event_reasons is not None:
            for reason, bit in CLOCKS_EVENT_REASONS.items():
                add(throttled, {**own, "reason": reason}, 1.0 if gpu.clocks_event_reasons & bit else 0.0)
        for kind, value in (("corrected", gpu.ecc_corrected_total), ("uncorrected", gpu.ecc_uncorrected_total)):
            if value is not None:
                add(ecc, {**own, "kind": kind}, value)
        remapped = gpu.remapped_rows
        if remapped is not None:
            add(rows, {**own, "kind": "correctable"}, remapped.correctable)
            add(rows, {**own, "kind": "uncorrectable"}, remapped.uncorrectable)
            add(pending, own, 1.0 if remapped.pending else 0.0)
            add(failed, own, 1.0 if remapped.failed else 0.0)
    yield from (throttled, ecc, rows, pending, failed)


def _fans_and_pcie(gpus: Iterable[GpuReading], labels: Labels) -> Iterator[Metric]:
    fans, pcie = metrics.DEVICE_FAN_SPEED_RATIO.new(), metrics.DEVICE_PCIE_THROUGHPUT_BYTES_PER_SECOND.new()
    for gpu in gpus:
        own = labels(gpu, None)
        for fan, ratio in gpu.fan_speed_ratios or ():
            add(fans, {**own, "fan": str(fan)}, ratio)
        for direction, value in (("tx", gpu.pcie_tx_bytes_per_second), ("rx", gpu.pcie_rx_bytes_per_second)):
            if value is not None:
                add(pcie, {**own, "direction": direction}, value)
    yield from (fans, pcie)


def _nvlink(
    gpus: Iterable[GpuReading], labels: Labels, totals: Mapping[int, NvLinkTotals], per_link: bool
) -> Iterator[Metric]:
    active, data, errors = (
        metrics.DEVICE_NVLINK_ACTIVE.new(),
        metrics.DEVICE_NVLINK_DATA_BYTES.new(),
        metrics.DEVICE_NVLINK_ERRORS.new(),
    )
    for gpu in gpus:
        own = labels(gpu, None)
        for link in gpu.nvlinks or ():
            # Each link's state always: a link goes down on its own, and JaxmonGpuNvlinkDown names it.
            add(active, {**own, "link": str(link.link)}, 1.0 if link.active else 0.0)
        if gpu.nvlinks is None:
            continue
        if per_link:
            for link in gpu.nvlinks:
                named = {**own, "link": str(link.link)}
                for direction, value in (("tx", link.tx_bytes_total), ("rx", link.rx_bytes_total)):
                    if value is not None:
                        add(data, {**named, "direction": direction}, value)
                for kind, count in link.errors().items():
                    add(errors, {**named, "kind": kind}, count)
            continue
        summed = totals.get(gpu.index) or sum_links(gpu.nvlinks)
        for direction, value in summed.bytes.items():
            add(data, {**own, "direction": direction}, value)
        for kind, count in summed.errors.items():
            add(errors, {**own, "kind": kind}, count)
    yield from (active, data, errors)


def _mig(gpus: Iterable[GpuReading], labels: Labels) -> Iterator[Metric]:
    enabled, info = metrics.DEVICE_MIG_ENABLED.new(), metrics.MIG_DEVICE_INFO.new()
    total, used, duty = (
        metrics.MIG_DEVICE_MEMORY_TOTAL_BYTES.new(),
        metrics.MIG_DEVICE_MEMORY_USED_BYTES.new(),
        metrics.MIG_DEVICE_DUTY_CYCLE_RATIO.new(),
    )
    for gpu in gpus:
        if gpu.mig_enabled is not None:
            add(enabled, labels(gpu, None), 1.0 if gpu.mig_enabled else 0.0)
        for mig in gpu.mig_devices or ():
            own = labels(gpu, mig)
            add(info, {**own, "name": mig.name or ""}, 1.0)
            for fam, value in (
                (total, mig.memory_total_bytes),
                (used, mig.memory_used_bytes),
                (duty, mig.duty_cycle_ratio),
            ):
                if value is not None:
                    add(fam, own, value)
    yield from (enabled, info, total, used, duty)


# GPM (jaxmon/sources/nvml/gpm.py): each value an average over the interval between the GPU's last two GPM samples
# (at least 100 ms apart; one poll interval apart normally), NVML's percent / 100. A MIG GPU instance's are the same
# families with the MIG device's labels (mig_uuid, gpu_instance, compute_instance, profile).
# GPM metric id -> (family, its `pipe` label or None).
GPM_SERIES: dict[int, tuple[Family, str | None]] = {
    1: (metrics.DEVICE_GRAPHICS_ENGINE_ACTIVE_RATIO, None),
    2: (metrics.DEVICE_SM_ACTIVE_RATIO, None),
    3: (metrics.DEVICE_SM_OCCUPANCY_RATIO, None),
    5: (metrics.DEVICE_TENSOR_ACTIVE_RATIO, None),
    10: (metrics.DEVICE_DRAM_ACTIVE_RATIO, None),
    11: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "fp64"),
    12: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "fp32"),
    13: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "fp16"),
    7: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "tensor_hmma"),
    9: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "tensor_imma"),
    6: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "tensor_dfma"),
    4: (metrics.DEVICE_PIPE_ACTIVE_RATIO, "integer"),
}
assert set(GPM_SERIES) == set(GPM_METRICS)


def _gpm(gpus: Iterable[GpuReading], labels: Labels, pipes: bool) -> Iterator[Metric]:
    supported = metrics.DEVICE_GPM_SUPPORTED.new()
    families = {spec.name: spec.new() for spec, _ in GPM_SERIES.values()}
    for gpu in gpus:
        if gpu.gpm_supported is not None:
            add(supported, labels(gpu, None), 1.0 if gpu.gpm_supported else 0.0)
        owners: list[tuple[MigDevice | None, Iterable[tuple[int, float]]]] = [(None, gpu.gpm or ())]
        owners += [(mig, mig.gpm or ()) for mig in gpu.mig_devices or ()]
        for owner, values in owners:
            own = labels(gpu, owner)
            for metric, value in values:
                spec, pipe = GPM_SERIES[metric]  # the source reads these ids alone
                if pipe is None:
                    add(families[spec.name], own, value)
                elif pipes:
                    add(families[spec.name], {**own, "pipe": pipe}, value)
    yield supported
    yield from families.values()


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
