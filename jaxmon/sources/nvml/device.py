"""One GPU's readings: what is asked once per handle (identity, clock maxima, NVLink links) and what every poll asks.

Every reading that NVML does not offer on this GPU, driver or container (NOT_SUPPORTED, FUNCTION_NOT_FOUND,
NO_PERMISSION) is None; any other error raises, and fails this GPU's poll alone (library.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pynvml

from jaxmon.sources.nvml.calls import ABSENT, Versions, memory, optional, text
from jaxmon.sources.nvml.mig import MigIdentity
from jaxmon.sources.nvml.mig import read as read_mig
from jaxmon.sources.nvml.nvlink import discover as discover_links
from jaxmon.sources.nvml.nvlink import read as read_links
from jaxmon.sources.nvml.process_util import read as read_process_util
from jaxmon.sources.nvml.readings import GpuReading, Process, RemappedRows

_CLOCK_TYPES = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}


@dataclass
class Known:
    """What a GPU's handle gives once: identity, clock maxima (fixed by the board), and its NVLink links."""

    name: str
    uuid: str
    pci_bus_id: str
    # N of /dev/nvidiaN: how device-name ids (`nvidiaN`, the kubelet's pod-resources on GKE) name the GPU.
    minor_number: int | None = None
    max_clocks_hertz: dict[str, float | None] = field(default_factory=dict)
    links: tuple[int, ...] = ()
    # The identities of its MIG devices seen at the last poll, by MIG UUID.
    mig_identities: dict[str, MigIdentity] = field(default_factory=dict)
    # The newest per-process utilization sample's timestamp (NVML's CPU time in µs; 0: every sample NVML holds).
    process_util_seen: int = 0

    def reading(self, index: int, **fields: Any) -> GpuReading:
        """GPU `index`'s reading with this identity and `fields` (its readings, or the error of a failed poll)."""
        return GpuReading(
            index=index,
            name=self.name,
            uuid=self.uuid,
            pci_bus_id=self.pci_bus_id,
            minor_number=self.minor_number,
            **fields,
        )


def open_known(handle: Any) -> Known:
    """Ask a freshly opened handle for what does not change while it is open."""
    maxima: dict[str, float | None] = {}
    for clock, kind in _CLOCK_TYPES.items():
        maxima[clock] = _mhz(partial(pynvml.nvmlDeviceGetMaxClockInfo, handle, kind))
    return Known(
        name=str(pynvml.nvmlDeviceGetName(handle)),
        uuid=str(pynvml.nvmlDeviceGetUUID(handle)),
        pci_bus_id=text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        minor_number=optional(lambda: int(pynvml.nvmlDeviceGetMinorNumber(handle))),
        max_clocks_hertz=maxima,
        links=discover_links(handle),
    )


def read(index: int, handle: Any, known: Known, versions: Versions) -> GpuReading:
    """Every reading of one GPU in this poll."""
    total, used = memory(handle, versions)
    util = optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    encoder = optional(lambda: pynvml.nvmlDeviceGetEncoderUtilization(handle))
    decoder = optional(lambda: pynvml.nvmlDeviceGetDecoderUtilization(handle))
    # NVML reports milliwatts, millijoules, MHz and KB/s.
    power = _per(1000, lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    limit = _per(1000, lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    management = _per(1000, lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle))
    energy = _per(1000, lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
    temperature = _per(1, lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    clocks = {name: _mhz(partial(pynvml.nvmlDeviceGetClockInfo, handle, kind)) for name, kind in _CLOCK_TYPES.items()}
    # nvmlDeviceGetPcieThroughput samples a byte counter for 20 ms per call (nvml.h); its KB are KiB.
    tx = _kib(lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES))
    rx = _kib(lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES))
    replays = optional(lambda: int(pynvml.nvmlDeviceGetPcieReplayCounter(handle)))
    corrected, uncorrected = _ecc(handle)
    mig_enabled, mig_devices, known.mig_identities = read_mig(handle, versions, known.mig_identities)
    maxima = known.max_clocks_hertz
    processes = _processes(handle, versions)
    process_util, known.process_util_seen = read_process_util(handle, versions, known.process_util_seen, processes)
    return known.reading(
        index,
        memory_total_bytes=total,
        memory_used_bytes=used,
        duty_cycle_ratio=None if util is None else int(util.gpu) / 100.0,
        memory_bandwidth_utilization_ratio=None if util is None else int(util.memory) / 100.0,
        encoder_utilization_ratio=None if encoder is None else int(encoder[0]) / 100.0,
        decoder_utilization_ratio=None if decoder is None else int(decoder[0]) / 100.0,
        power_watts=power,
        power_limit_watts=limit,
        power_management_limit_watts=management,
        energy_joules_total=energy,
        temperature_celsius=temperature,
        fan_speed_ratios=_fans(handle, versions),
        graphics_clock_hertz=clocks["graphics"],
        sm_clock_hertz=clocks["sm"],
        memory_clock_hertz=clocks["memory"],
        video_clock_hertz=clocks["video"],
        graphics_clock_max_hertz=maxima.get("graphics"),
        sm_clock_max_hertz=maxima.get("sm"),
        memory_clock_max_hertz=maxima.get("memory"),
        video_clock_max_hertz=maxima.get("video"),
        clocks_event_reasons=_reasons(handle, versions),
        ecc_corrected_total=corrected,
        ecc_uncorrected_total=uncorrected,
        remapped_rows=_remapped_rows(handle),
        pcie_tx_bytes_per_second=tx,
        pcie_rx_bytes_per_second=rx,
        pcie_replays_total=replays,
        nvlinks=read_links(handle, known.links),
        mig_enabled=mig_enabled,
        mig_devices=mig_devices,
        processes=processes,
        process_utilization=process_util,
    )


def _per(divisor: int, call: Callable[[], Any]) -> float | None:
    """An NVML integer in thousandths (mW, mJ) or units, as a float of the base unit; None where not offered."""
    value = optional(call)
    return None if value is None else int(value) / divisor


def _mhz(call: Callable[[], Any]) -> float | None:
    value = optional(call)
    return None if value is None else int(value) * 1e6


def _kib(call: Callable[[], Any]) -> float | None:
    value = optional(call)
    return None if value is None else float(int(value) * 1024)


def _reasons(handle: Any, versions: Versions) -> int | None:
    # nvmlDeviceGetCurrentClocksEventReasons replaced ...ClocksThrottleReasons (same bits) in driver 535.
    if versions.clocks_event_reasons:
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                if err.value in ABSENT:
                    return None
                raise
            versions.clocks_event_reasons = False
    return optional(lambda: int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))


def _fans(handle: Any, versions: Versions) -> tuple[tuple[int, float], ...] | None:
    """Each fan's speed as a share of its maximum (NVML: percent, the intended speed; above 100 % where the fan is
    driven past its rating). None where the board has no fans NVML controls (SXM boards)."""
    if versions.fans_v2:
        try:
            count = int(pynvml.nvmlDeviceGetNumFans(handle))
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                if err.value in ABSENT:
                    return None
                raise
            versions.fans_v2 = False
        else:
            speeds = {fan: optional(partial(pynvml.nvmlDeviceGetFanSpeed_v2, handle, fan)) for fan in range(count)}
            found = tuple((fan, int(speed) / 100.0) for fan, speed in speeds.items() if speed is not None)
            return found or None
    speed = optional(lambda: int(pynvml.nvmlDeviceGetFanSpeed(handle)))
    return None if speed is None else ((0, speed / 100.0),)


def _remapped_rows(handle: Any) -> RemappedRows | None:
    rows = optional(lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
    if rows is None:
        return None
    correctable, uncorrectable, pending, failed = rows
    return RemappedRows(int(correctable), int(uncorrectable), bool(pending), bool(failed))


def _processes(handle: Any, versions: Versions) -> tuple[Process, ...] | None:
    if versions.processes_v3:
        try:
            return _procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle))
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                if err.value in ABSENT:
                    return None
                raise
            versions.processes_v3 = False
    found = optional(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle))
    return None if found is None else _procs(found)


def _ecc(handle: Any) -> tuple[int | None, int | None]:
    """Volatile ECC error counts (since the driver loaded); absent where ECC is off or unsupported."""
    mode = optional(lambda: pynvml.nvmlDeviceGetEccMode(handle))
    if mode is None or int(mode[0]) != pynvml.NVML_FEATURE_ENABLED:
        return None, None

    def count(kind: int) -> int | None:
        return optional(
            lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, pynvml.NVML_VOLATILE_ECC)),
        )

    return count(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED), count(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)


def _procs(found: list[Any]) -> tuple[Process, ...]:
    # pynvml turns NVML_VALUE_NOT_AVAILABLE (WDDM, or a process in another container on some drivers) into None.
    return tuple(
        Process(pid=int(p.pid), used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in found
    )
