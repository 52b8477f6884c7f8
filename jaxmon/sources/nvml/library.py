"""An initialised NVML: the handles of every GPU, each GPU read on its own, and the thread that counts Xid events."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml
import structlog

from jaxmon.sources.nvml.calls import NvmlUnavailable, Versions, describe, probe_reason
from jaxmon.sources.nvml.device import Known, open_known
from jaxmon.sources.nvml.device import read as read_gpu
from jaxmon.sources.nvml.readings import GpuReading

log = structlog.get_logger("jaxmon.sources.nvml")


def _address(handle: Any) -> int:
    """A device handle's pointer value: event data names the device by the same handle."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


@dataclass
class Nvml:
    """An initialised NVML: per-GPU reads with fallbacks for older drivers, and the Xid watcher thread."""

    xid_wait_seconds: float = 0.5
    _handles: dict[int, Any] = field(default_factory=dict)
    _known: dict[int, Known] = field(default_factory=dict)
    _versions: Versions = field(default_factory=Versions)
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
            return read_gpu(index, handle, self._known[index], self._versions)
        except pynvml.NVMLError as err:
            # A lost GPU fails every call, and may fail again once its handle is re-opened: open it afresh next poll.
            self._handles.pop(index, None)
            known = self._known.get(index)
            if known is None:
                return GpuReading(index=index, error=describe(err))
            return known.reading(index, error=describe(err))

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._known[index] = open_known(handle)
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
