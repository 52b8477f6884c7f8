"""The nvml collector's per-GPU families: one spec per NVML reading, rendered with the labels the collector makes.

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

from jaxmon.families import Spec, add
from jaxmon.families.shared import (
    DEVICE_DUTY_CYCLE,
    DEVICE_MEMORY_BANDWIDTH,
    DEVICE_MEMORY_TOTAL,
    DEVICE_MEMORY_USED,
)
from jaxmon.sources.nvml import (
    CLOCKS_EVENT_REASONS,
    GPM_METRICS,
    GpuReading,
    MigDevice,
    NvLink,
)

Labels = Callable[[GpuReading, MigDevice | None], dict[str, str]]

# One series per GPU: (family, GpuReading attribute).
GPU_VALUES: tuple[tuple[Spec, str], ...] = (
    (DEVICE_MEMORY_TOTAL, "memory_total_bytes"),
    (DEVICE_MEMORY_USED, "memory_used_bytes"),
    (DEVICE_DUTY_CYCLE, "duty_cycle_ratio"),
    (DEVICE_MEMORY_BANDWIDTH, "memory_bandwidth_utilization_ratio"),
    (
        Spec(
            "jaxmon_device_encoder_utilization_ratio",
            "Share of the last sample period the video encoder (NVENC) was busy (NVML, 0-1).",
        ),
        "encoder_utilization_ratio",
    ),
    (
        Spec(
            "jaxmon_device_decoder_utilization_ratio",
            "Share of the last sample period the video decoders (NVDEC) were busy (NVML, 0-1).",
        ),
        "decoder_utilization_ratio",
    ),
    (Spec("jaxmon_device_power_watts", "Power draw of the device (NVML power usage)."), "power_watts"),
    (Spec("jaxmon_device_power_limit_watts", "Enforced power limit of the device (NVML)."), "power_limit_watts"),
    (
        Spec(
            "jaxmon_device_power_management_limit_watts",
            "Power management limit set on the device (NVML; the enforced limit is the lowest of this and the "
            "board's other constraints).",
        ),
        "power_management_limit_watts",
    ),
    (
        Spec(
            "jaxmon_device_energy_joules",
            "Energy the device consumed since the driver loaded (NVML total energy consumption).",
            counter=True,
        ),
        "energy_joules_total",
    ),
    (Spec("jaxmon_device_temperature_celsius", "GPU core temperature (NVML)."), "temperature_celsius"),
    (Spec("jaxmon_device_graphics_clock_hertz", "Current graphics clock (NVML)."), "graphics_clock_hertz"),
    (Spec("jaxmon_device_sm_clock_hertz", "Current SM clock (NVML)."), "sm_clock_hertz"),
    (Spec("jaxmon_device_memory_clock_hertz", "Current memory clock (NVML)."), "memory_clock_hertz"),
    (Spec("jaxmon_device_video_clock_hertz", "Current video clock (NVML)."), "video_clock_hertz"),
    (
        Spec("jaxmon_device_graphics_clock_max_hertz", "Highest graphics clock of the device (NVML)."),
        "graphics_clock_max_hertz",
    ),
    (Spec("jaxmon_device_sm_clock_max_hertz", "Highest SM clock of the device (NVML)."), "sm_clock_max_hertz"),
    (
        Spec("jaxmon_device_memory_clock_max_hertz", "Highest memory clock of the device (NVML)."),
        "memory_clock_max_hertz",
    ),
    (Spec("jaxmon_device_video_clock_max_hertz", "Highest video clock of the device (NVML)."), "video_clock_max_hertz"),
    (
        Spec(
            "jaxmon_device_pcie_replays",
            "PCIe packets the link had to resend (NVML PCIe replay counter); a rising count is a failing link.",
            counter=True,
        ),
        "pcie_replays_total",
    ),
)

THROTTLED = Spec(
    "jaxmon_device_throttled",
    "1 when NVML reports this clocks event (throttle) reason as active, else 0; one series per known reason.",
)
ECC = Spec(
    "jaxmon_device_ecc_errors",
    "Volatile ECC errors (since the driver loaded) by kind; absent where ECC is off or unsupported.",
    counter=True,
)
FAN = Spec(
    "jaxmon_device_fan_speed_ratio",
    "Each fan's intended speed as a share of its maximum (NVML; above 1 where driven past it); absent without fans.",
)
PCIE_THROUGHPUT = Spec(
    "jaxmon_device_pcie_throughput_bytes_per_second",
    "PCIe traffic of the device by direction (tx: sent by the GPU, rx: received), over NVML's 20 ms sample.",
)
REMAPPED_ROWS = Spec(
    "jaxmon_device_remapped_rows",
    "Memory rows the row remapper replaced with spares, by the kind of error that caused it (NVML; Ampere and newer).",
    counter=True,
)
REMAPPING_PENDING = Spec(
    "jaxmon_device_row_remapping_pending",
    "1 while a row remapping waits for a GPU reset to take effect (NVML), else 0.",
)
REMAPPING_FAILED = Spec(
    "jaxmon_device_row_remapping_failed",
    "1 when a row remapping failed (no spare row left: the GPU needs replacing; NVML), else 0.",
)
NVLINK_ACTIVE = Spec("jaxmon_device_nvlink_active", "1 when this NVLink is active, 0 when it is down (NVML).")
# Traffic and errors are one series per GPU by default, summed over its links (no `link` label); with
# --collector.nvml.nvlink-links, one per link instead (a `link` label). A daemon exports one shape or the other, never
# both, so `sum by (device, ...)` over either gives the GPU's total and the name cannot double count.
NVLINK_BYTES = Spec(
    "jaxmon_device_nvlink_data_bytes",
    "Payload bytes over the GPU's NVLinks by direction since the driver loaded (NVML NVLink throughput counters), "
    "summed over its links (a link down counts with its last reading); per link (a link label, active links only) "
    "with --collector.nvml.nvlink-links.",
    counter=True,
)
NVLINK_ERRORS = Spec(
    "jaxmon_device_nvlink_errors",
    "NVLink data-link errors by kind (replay, recovery, crc_flit, crc_data) since the driver loaded (NVML), summed "
    "over the GPU's links (a link down counts with its last reading); per link (a link label, active links only) "
    "with --collector.nvml.nvlink-links.",
    counter=True,
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


MIG_ENABLED = Spec("jaxmon_device_mig_enabled", "1 when the GPU runs in MIG mode, 0 when not; absent without MIG.")
MIG_INFO = Spec(
    "jaxmon_mig_device_info",
    "Each MIG device of a GPU in MIG mode, by its UUID (what pods and CUDA_VISIBLE_DEVICES name), GPU and compute "
    "instance and profile; always 1.",
)
MIG_MEMORY_TOTAL = Spec("jaxmon_mig_device_memory_total_bytes", "Device memory of the MIG device in total (NVML).")
MIG_MEMORY_USED = Spec("jaxmon_mig_device_memory_used_bytes", "Device memory in use on the MIG device (NVML).")
MIG_DUTY_CYCLE = Spec(
    "jaxmon_mig_device_duty_cycle_ratio",
    "Share of the last sample period the MIG device ran any kernel (NVML, 0-1); absent where the driver does not "
    "report it for MIG devices.",
)


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
    throttled, ecc = THROTTLED.new(), ECC.new()
    rows, pending, failed = REMAPPED_ROWS.new(), REMAPPING_PENDING.new(), REMAPPING_FAILED.new()
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
    fans, pcie = FAN.new(), PCIE_THROUGHPUT.new()
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
    active, data, errors = NVLINK_ACTIVE.new(), NVLINK_BYTES.new(), NVLINK_ERRORS.new()
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
    enabled, info = MIG_ENABLED.new(), MIG_INFO.new()
    total, used, duty = MIG_MEMORY_TOTAL.new(), MIG_MEMORY_USED.new(), MIG_DUTY_CYCLE.new()
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
_OVER = "averaged over the interval between the last two GPM samples (one poll interval)"
GPM_SUPPORTED = Spec(
    "jaxmon_device_gpm_supported",
    "1 when NVML serves GPM profiling metrics for the GPU (Hopper and newer), 0 when not (no GPM series for it then; "
    "the log says why); absent with --collector.nvml.gpm false.",
)
SM_ACTIVE = Spec(
    "jaxmon_device_sm_active_ratio",
    f"Share of the SMs that were busy (at least one warp resident), {_OVER} (NVML GPM SM_UTIL / 100; dcgm-exporter's "
    "DCGM_FI_PROF_SM_ACTIVE).",
)
SM_OCCUPANCY = Spec(
    "jaxmon_device_sm_occupancy_ratio",
    f"Resident warps as a share of the SMs' theoretical maximum, {_OVER} (NVML GPM SM_OCCUPANCY / 100; "
    "DCGM_FI_PROF_SM_OCCUPANCY).",
)
TENSOR_ACTIVE = Spec(
    "jaxmon_device_tensor_active_ratio",
    f"Share of cycles any tensor pipe was active, {_OVER} (NVML GPM ANY_TENSOR_UTIL / 100; "
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
)
DRAM_ACTIVE = Spec(
    "jaxmon_device_dram_active_ratio",
    f"Device memory bandwidth used as a share of its peak, {_OVER} (NVML GPM DRAM_BW_UTIL / 100; "
    "DCGM_FI_PROF_DRAM_ACTIVE).",
)
GRAPHICS_ENGINE_ACTIVE = Spec(
    "jaxmon_device_graphics_engine_active_ratio",
    f"Share of time the graphics/compute engine was active, {_OVER} (NVML GPM GRAPHICS_UTIL / 100; "
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE).",
)
PIPE_ACTIVE = Spec(
    "jaxmon_device_pipe_active_ratio",
    f"Share of cycles each SM pipe was active, {_OVER}, by pipe: fp64, fp32, fp16 (non-tensor math), tensor_hmma, "
    "tensor_imma, tensor_dfma, integer (NVML GPM *_UTIL / 100; DCGM_FI_PROF_PIPE_*_ACTIVE); with "
    "--collector.nvml.gpm-pipes.",
)
# GPM metric id -> (family, its `pipe` label or None).
GPM_SERIES: dict[int, tuple[Spec, str | None]] = {
    1: (GRAPHICS_ENGINE_ACTIVE, None),
    2: (SM_ACTIVE, None),
    3: (SM_OCCUPANCY, None),
    5: (TENSOR_ACTIVE, None),
    10: (DRAM_ACTIVE, None),
    11: (PIPE_ACTIVE, "fp64"),
    12: (PIPE_ACTIVE, "fp32"),
    13: (PIPE_ACTIVE, "fp16"),
    7: (PIPE_ACTIVE, "tensor_hmma"),
    9: (PIPE_ACTIVE, "tensor_imma"),
    6: (PIPE_ACTIVE, "tensor_dfma"),
    4: (PIPE_ACTIVE, "integer"),
}
assert set(GPM_SERIES) == set(GPM_METRICS)


def _gpm(gpus: Iterable[GpuReading], labels: Labels, pipes: bool) -> Iterator[Metric]:
    supported = GPM_SUPPORTED.new()
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
