"""What one NVML poll of one GPU reads: plain frozen dataclasses, None for a number NVML does not report here."""

from __future__ import annotations

from dataclasses import dataclass

# nvml.h nvmlClocksEventReason* (named nvmlClocksThrottleReason* before driver 535): one bit each.
CLOCKS_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# The NVLink data-link error counters jaxmon reads (nvmlNvLinkErrorCounter_t), by the `kind` label they get.
NVLINK_ERROR_KINDS = ("replay", "recovery", "crc_flit", "crc_data")

# The GPM metrics jaxmon asks for (nvml.h nvmlGpmMetricId_t), by their nvml.h names: each a percentage averaged over
# the interval between two samples (jaxmon divides by 100). DCGM's profiling fields map to the same ids, each under
# two spellings: dcgm-exporter's up to 4.8, and DCGM 4.7's that dcgm-exporter 4.9 lists (docs/dcgm.md).
GPM_METRICS = {
    1: "GRAPHICS_UTIL",  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO
    2: "SM_UTIL",  # DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_UTIL_RATIO
    3: "SM_OCCUPANCY",  # DCGM_FI_PROF_SM_OCCUPANCY, DCGM_FI_PROF_SM_OCCUPANCY_RATIO
    4: "INTEGER_UTIL",  # DCGM_FI_PROF_PIPE_INT_ACTIVE, DCGM_FI_PROF_INT_UTIL_RATIO
    5: "ANY_TENSOR_UTIL",  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_TENSOR_UTIL_RATIO
    6: "DFMA_TENSOR_UTIL",  # DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE, DCGM_FI_PROF_DFMA_UTIL_RATIO
    7: "HMMA_TENSOR_UTIL",  # DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE, DCGM_FI_PROF_HMMA_UTIL_RATIO
    9: "IMMA_TENSOR_UTIL",  # DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE, DCGM_FI_PROF_IMMA_UTIL_RATIO
    10: "DRAM_BW_UTIL",  # DCGM_FI_PROF_DRAM_ACTIVE, DCGM_FI_PROF_DRAM_UTIL_RATIO
    11: "FP64_UTIL",  # DCGM_FI_PROF_PIPE_FP64_ACTIVE, DCGM_FI_PROF_FP64_UTIL_RATIO
    12: "FP32_UTIL",  # DCGM_FI_PROF_PIPE_FP32_ACTIVE, DCGM_FI_PROF_FP32_UTIL_RATIO
    13: "FP16_UTIL",  # DCGM_FI_PROF_PIPE_FP16_ACTIVE, DCGM_FI_PROF_FP16_UTIL_RATIO
}

# (GPM metric id, ratio 0-1) for each metric NVML computed over the last interval; a metric that failed is absent.
GpmValues = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Process:
    """A compute process on a GPU, as NVML reports it (pid in NVML's PID namespace: the host's, usually)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class ProcessUtilization:
    """A compute process's share of a GPU's engines over the samples NVML took of it since the previous poll
    (nvmlDeviceGetProcessUtilization, or nvmlDeviceGetProcessesUtilizationInfo where the driver has it): the mean of
    those samples, each NVML's percent of its sample period, as a ratio 0-1. `samples`: how many were averaged."""

    pid: int
    sm: float
    memory: float
    encoder: float
    decoder: float
    samples: int


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU: whether it is up, and for an active link its data traffic and its data-link error
    counters (since the driver loaded). An inactive link has its state alone."""

    link: int
    active: bool
    tx_bytes_total: int | None = None
    rx_bytes_total: int | None = None
    replay_errors_total: int | None = None
    recovery_errors_total: int | None = None
    crc_flit_errors_total: int | None = None
    crc_data_errors_total: int | None = None

    def errors(self) -> dict[str, int]:
        """The error counters NVML reported, by kind (NVLINK_ERROR_KINDS)."""
        out = {}
        for kind in NVLINK_ERROR_KINDS:
            value = getattr(self, f"{kind}_errors_total")
            if value is not None:
                out[kind] = value
        return out


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU in MIG mode: its identity (the UUID, `MIG-…`, is what the CUDA_VISIBLE_DEVICES of a
    container or the kubelet's pod resources name) and what NVML reports of it."""

    index: int  # NVML's MIG device index on the parent GPU
    uuid: str
    gpu_instance: int | None = None
    compute_instance: int | None = None
    # The MIG profile (`1g.18gb`; `1c.3g.71gb` for a compute instance smaller than its GPU instance), from the MIG
    # device's NVML name; None where the name carries none.
    profile: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    duty_cycle_ratio: float | None = None
    # Its GPU instance's GPM metrics (nvmlGpmMigSampleGet; the same on each compute instance of one GPU instance);
    # None until two samples at least 100 ms apart exist, or where the GPU has no GPM.
    gpm: GpmValues | None = None


@dataclass(frozen=True)
class RemappedRows:
    """The row remapper's state (Ampere and newer): rows remapped for correctable and uncorrectable errors, a
    remapping that waits for a GPU reset, and whether a remapping failed (no spare row left)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class GpuReading:
    """One poll of one GPU; None is a number this GPU does not report (an absent series)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    # N of /dev/nvidiaN: how device-name ids (`nvidiaN`, the kubelet's pod-resources on GKE) name the GPU.
    minor_number: int | None = None
    # Set when the device failed this poll (GPU lost, or any other error): no readings then.
    error: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    duty_cycle_ratio: float | None = None
    memory_bandwidth_utilization_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    power_management_limit_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_celsius: float | None = None
    # (fan, share of its maximum speed) per fan the driver reports; None on GPUs without fans (SXM boards).
    fan_speed_ratios: tuple[tuple[int, float], ...] | None = None
    graphics_clock_hertz: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    video_clock_hertz: float | None = None
    graphics_clock_max_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    video_clock_max_hertz: float | None = None
    clocks_event_reasons: int | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    remapped_rows: RemappedRows | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replays_total: int | None = None
    nvlinks: tuple[NvLink, ...] | None = None
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] | None = None
    processes: tuple[Process, ...] | None = None
    # Each process NVML sampled since the previous poll (one entry per pid); () where none was sampled since, None
    # where NVML offers no per-process utilization here (MIG mode, a driver without the calls).
    process_utilization: tuple[ProcessUtilization, ...] | None = None
    # Whether GPM (nvmlGpmQueryDeviceSupport) serves this GPU; None where jaxmon does not ask (--collector.nvml.gpm
    # false). `gpm`: the metrics over the interval between its last two samples (None until a second sample exists).
    gpm_supported: bool | None = None
    gpm: GpmValues | None = None

    @property
    def up(self) -> bool:
        """True when the device answered this poll."""
        return self.error is None
