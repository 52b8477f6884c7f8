"""NVML through nvidia-ml-py (`pynvml`): device-wide readings of every GPU, and a thread that counts Xid events.

pynvml loads `libnvidia-ml.so.1` with ctypes, so it needs no JAX GPU backend and allocates no device memory: a CPU
image monitors GPUs through the driver library the container toolkit mounts.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml
import structlog

log = structlog.get_logger("jaxmon.sources.nvml")

T = TypeVar("T")

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

# A field this GPU, driver or container does not offer: its series is absent, the device is still up.
_ABSENT = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
)
# A versioned call the library has in another version only: try the older one.
_OLDER = (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: the library does not load, or it does not initialise (no driver)."""


def describe(err: pynvml.NVMLError) -> str:
    """`NVML_ERROR_GPU_IS_LOST (GPU is lost)`-style text for an NVML error."""
    names = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
    return f"{names.get(err.value, f'NVML error {err.value}')} ({err})"


def probe_library() -> str | None:
    """Why NVML cannot be used in this process, or None when it initialises."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return probe_reason(err)
    pynvml.nvmlShutdown()
    return None


@dataclass(frozen=True)
class Process:
    """A compute process on a GPU, as NVML reports it (pid in NVML's PID namespace: the host's, usually)."""

    pid: int
    used_bytes: int | None


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
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    clocks_event_reasons: int | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    processes: tuple[Process, ...] | None = None

    @property
    def up(self) -> bool:
        """True when the device answered this poll."""
        return self.error is None


@dataclass
class _Identity:
    name: str
    uuid: str
    pci_bus_id: str
    minor_number: int | None = None


def _optional(call: Callable[[], T]) -> T | None:
    """`call()`, or None where the field is not offered here; any other NVML error fails the device."""
    try:
        return call()
    except pynvml.NVMLError as err:
        if err.value in _ABSENT:
            return None
        raise


def _address(handle: Any) -> int:
    """A device handle's pointer value: event data names the device by the same handle."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


@dataclass
class _Versions:
    """Which version of each versioned call this library has (learnt on the first call, then kept)."""

    memory_v2: bool = True
    processes_v3: bool = True
    clocks_event_reasons: bool = True


@dataclass
class Nvml:
    """An initialised NVML: per-GPU reads with fallbacks for older drivers, and the Xid watcher thread."""

    xid_wait_seconds: float = 0.5
    _handles: dict[int, Any] = field(default_factory=dict)
    _identity: dict[int, _Identity] = field(default_factory=dict)
    _versions: _Versions = field(default_factory=_Versions)
    _open: bool = False
    _events: Any = None
    _registered: set[int] = field(default_factory=set)
    _index_of: dict[int, int] = field(default_factory=dict)
    _xid: dict[tuple[int, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def open(self) -> None:
        """Initialise NVML and start the Xid watcher; raises NvmlUnavailable."""
        if self._open:
            return
        reason = None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            reason = probe_reason(err)
        if reason is not None:
            raise NvmlUnavailable(reason)
        self._open = True
        try:
            self._events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            log.warning("NVML Xid events unavailable", error=describe(err))
            return
        self._thread = threading.Thread(target=self._watch, name="jaxmon-nvml-xid", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watcher, free the event set and shut NVML down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.xid_wait_seconds + 5.0)
        if not self._open:
            return
        self._open = False
        try:
            if self._events is not None:
                pynvml.nvmlEventSetFree(self._events)
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("NVML shutdown failed", error=describe(err))

    def read_all(self) -> list[GpuReading]:
        """One reading per GPU NVML counts; a failing GPU gives a reading with `error` set."""
        count = int(pynvml.nvmlDeviceGetCount())
        return [self.read(index) for index in range(count)]

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """Critical Xid events seen since start, per (NVML index, xid)."""
        with self._lock:
            return dict(self._xid)

    def read(self, index: int) -> GpuReading:
        """Every reading of GPU `index`."""
        try:
            handle = self._handle(index)
            identity = self._identity[index]
            return self._read(index, handle, identity)
        except pynvml.NVMLError as err:
            # A lost GPU fails every call, and may fail again once its handle is re-opened: open it afresh next poll.
            self._handles.pop(index, None)
            known = self._identity.get(index)
            if known is None:
                return GpuReading(index=index, error=describe(err))
            return GpuReading(
                index=index,
                name=known.name,
                uuid=known.uuid,
                pci_bus_id=known.pci_bus_id,
                minor_number=known.minor_number,
                error=describe(err),
            )

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._identity[index] = _Identity(
                name=str(pynvml.nvmlDeviceGetName(handle)),
                uuid=str(pynvml.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                minor_number=_optional(lambda: int(pynvml.nvmlDeviceGetMinorNumber(handle))),
            )
            self._handles[index] = handle
            self._register(index, handle)
        return handle

    def _register(self, index: int, handle: Any) -> None:
        """Ask for this GPU's critical Xid events (once per handle; unsupported here means no Xid series)."""
        address = _address(handle)
        if self._events is None or address in self._registered:
            return
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
        except pynvml.NVMLError as err:
            log.warning("NVML Xid events unavailable for a GPU", gpu=index, error=describe(err))
            return
        with self._lock:
            self._index_of[address] = index
            self._registered.add(address)

    def _read(self, index: int, handle: Any, identity: _Identity) -> GpuReading:
        total, used = self._memory(handle)
        util = _optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
        power = _optional(lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle)))
        limit = _optional(lambda: int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)))
        temperature = _optional(lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)))
        clock = _optional(lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)))
        corrected, uncorrected = self._ecc(handle)
        return GpuReading(
            index=index,
            name=identity.name,
            uuid=identity.uuid,
            pci_bus_id=identity.pci_bus_id,
            minor_number=identity.minor_number,
            memory_total_bytes=total,
            memory_used_bytes=used,
            duty_cycle_ratio=None if util is None else int(util.gpu) / 100.0,
            memory_bandwidth_utilization_ratio=None if util is None else int(util.memory) / 100.0,
            # NVML reports milliwatts and MHz.
            power_watts=None if power is None else power / 1000.0,
            power_limit_watts=None if limit is None else limit / 1000.0,
            temperature_celsius=None if temperature is None else float(temperature),
            sm_clock_hertz=None if clock is None else clock * 1e6,
            clocks_event_reasons=self._reasons(handle),
            ecc_corrected_total=corrected,
            ecc_uncorrected_total=uncorrected,
            processes=self._processes(handle),
        )

    def _memory(self, handle: Any) -> tuple[int | None, int | None]:
        # v2 (driver 510+) reports the driver's reservation apart; v1 counts it as used.
        if self._versions.memory_v2:
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                return int(mem.total), int(mem.used)
            except pynvml.NVMLError as err:
                if err.value not in _OLDER:
                    if err.value in _ABSENT:
                        return None, None
                    raise
                self._versions.memory_v2 = False
        mem = _optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
        return (None, None) if mem is None else (int(mem.total), int(mem.used))

    def _reasons(self, handle: Any) -> int | None:
        # nvmlDeviceGetCurrentClocksEventReasons replaced ...ClocksThrottleReasons (same bits) in driver 535.
        if self._versions.clocks_event_reasons:
            try:
                return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    if err.value in _ABSENT:
                        return None
                    raise
                self._versions.clocks_event_reasons = False
        return _optional(lambda: int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))

    def _processes(self, handle: Any) -> tuple[Process, ...] | None:
        if self._versions.processes_v3:
            try:
                return _procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle))
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    if err.value in _ABSENT:
                        return None
                    raise
                self._versions.processes_v3 = False
        found = _optional(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle))
        return None if found is None else _procs(found)

    def _ecc(self, handle: Any) -> tuple[int | None, int | None]:
        """Volatile ECC error counts (since the driver loaded); absent where ECC is off or unsupported."""
        mode = _optional(lambda: pynvml.nvmlDeviceGetEccMode(handle))
        if mode is None or int(mode[0]) != pynvml.NVML_FEATURE_ENABLED:
            return None, None

        def count(kind: int) -> int | None:
            return _optional(
                lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, pynvml.NVML_VOLATILE_ECC)),
            )

        return count(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED), count(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)

    def _watch(self) -> None:
        """Count critical Xid events; waits at most `xid_wait_seconds` per call so that stop() ends it promptly."""
        timeout_ms = max(1, int(self.xid_wait_seconds * 1000))
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait(self._events, timeout_ms)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_TIMEOUT:
                    # GPU_IS_LOST and friends: keep waiting for the other GPUs, without spinning.
                    log.warning("NVML Xid event wait failed", error=describe(err))
                    self._stop.wait(self.xid_wait_seconds)
                continue
            if int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                with self._lock:
                    index = self._index_of.get(_address(data.device))
                    if index is None:
                        continue
                    key = (index, int(data.eventData))
                    self._xid[key] = self._xid.get(key, 0) + 1
                log.warning("NVML reported a critical Xid event", gpu=index, xid=int(data.eventData))


def probe_reason(err: pynvml.NVMLError) -> str:
    """What an nvmlInit failure means, for the log and `unavailable()`."""
    if err.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "libnvidia-ml.so.1 does not load (no NVIDIA driver library on the library path)"
    return f"NVML does not initialise: {describe(err)}"


def _text(value: str | bytes) -> str:
    # pynvml's structures hand char arrays back as str (its _PrintableStructure decodes them); older ones as bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def _procs(found: list[Any]) -> tuple[Process, ...]:
    # pynvml turns NVML_VALUE_NOT_AVAILABLE (WDDM, or a process in another container on some drivers) into None.
    return tuple(
        Process(pid=int(p.pid), used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in found
    )
