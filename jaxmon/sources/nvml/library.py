"""An initialised NVML: the handles of every GPU, the GPUs read on reader threads under a deadline, and the thread
that counts Xid events.

Around an Xid 79 (a GPU fallen off the bus) NVML calls on that GPU can hang for seconds or longer, so no poll makes
an NVML call on its own thread: the reads run on reader threads (`readers.Readers`), and a poll waits for them until one
deadline. A GPU whose read has not returned by then reads as failed (no values), and is not read again until that
read returns. So a wedged GPU holds exactly one thread, never a pile of them, and the other GPUs' readings keep
arriving at the poll's cadence. One reader thread reads the GPUs in turn while their reads return promptly (a
thread per GPU, all woken every poll, cost 8 wake-ups each way and the GIL handed between them call by call: about
a sixth of a poll's CPU); where no read has returned for 1/(n+1) of the deadline while GPUs wait (a hung read, or
reads slow enough to miss it in turn), another thread takes the queue on, so the GPUs behind a wedged one are read
in time. A GPU's first read opens its handle and reads what it gives once (its identity, limits, Xid
registration): on a driver that wakes its GPUs at first use (persistence mode off) that takes seconds, so it gets
FIRST_READ_SECONDS (at least the deadline) and a start-up is not logged as eight unresponsive GPUs.

Thread safety: a GPU's handle and what it gave once (`_handles`, `_known`) are written by the thread reading that
GPU, one at a time, under `_lock` (never held across an NVML call); the Xid watcher's maps are read and written
under the same lock. A GPU's GPM samples (`_gpm`, gpm.py) are used by the thread reading that GPU alone (a GPU is
read by one thread at a time), and freed by `close()` where no read of it is in flight.

`close()` then `open()` gives a working source again: a new NVML session, the handles opened afresh and registered
on the new event set, the Xid watcher running again. `close()` is meant for when no poll runs (the runtime stops a
collector only once its poll has returned); one that does run meanwhile ends with its GPUs failed, not an exception.
A read hung in the driver across `close()` keeps its GPU busy (and its GPM samples) until that call returns: the
GPU reads as unresponsive until then, after `open()` too, and is never read by two threads at once.
`Versions` flags only ever go from True to False (an older call found), whichever reader learns it first.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pynvml
import structlog

from jaxmon.sources.nvml.calls import NvmlUnavailable, Versions, describe, probe_reason
from jaxmon.sources.nvml.device import Known, open_known
from jaxmon.sources.nvml.device import read as read_gpu
from jaxmon.sources.nvml.gpm import GpuGpm
from jaxmon.sources.nvml.readers import IDLE_NAME as IDLE_NAME
from jaxmon.sources.nvml.readers import Readers as _Readers
from jaxmon.sources.nvml.readers import reader_name as reader_name
from jaxmon.sources.nvml.readers import unresponsive as unresponsive
from jaxmon.sources.nvml.readings import GpuReading

log = structlog.get_logger("jaxmon.sources.nvml")


# The budget of a GPU's first read (see the module's docstring), when it is longer than the poll's deadline.
FIRST_READ_SECONDS = 10.0


def _address(handle: Any) -> int:
    """A device handle's pointer value: event data names the device by the same handle."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


@dataclass
class Nvml:
    """An initialised NVML: per-GPU reads with fallbacks for older drivers, and the Xid watcher thread."""

    xid_wait_seconds: float = 0.5
    # How long read_all() waits for the GPUs' reads.
    timeout_seconds: float = 2.0
    # GPM (gpm.py): "auto" samples it where NVML says a GPU supports it, True the same but an unsupported GPU is
    # logged as a warning, False never asks.
    gpm: bool | Literal["auto"] = "auto"
    _readers: _Readers = field(init=False)
    # GPUs whose read hung across close(): their GPM samples are the old session's, freed once the read returns.
    _stale: set[int] = field(default_factory=set)
    _answered: set[int] = field(default_factory=set)  # GPUs whose reader has returned a reading at least once
    _handles: dict[int, Any] = field(default_factory=dict)
    _known: dict[int, Known] = field(default_factory=dict)
    _versions: Versions = field(default_factory=Versions)
    _open: bool = False
    _events: Any = None
    _registered: set[int] = field(default_factory=set)
    _gpm: dict[int, GpuGpm] = field(default_factory=dict)
    _gpm_logged: set[int] = field(default_factory=set)
    _index_of: dict[int, int] = field(default_factory=dict)
    _xid: dict[tuple[int, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._readers = _Readers(self.read)

    def open(self) -> None:
        """Initialise NVML and start the Xid watcher; raises NvmlUnavailable."""
        if self._open:
            return
        self._stop.clear()  # a watcher stopped by close() runs again
        self._readers.restart()
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
        """Stop the watcher and the readers (a hung read is not waited for), free the event set and shut NVML down;
        `open()` starts afresh (the handles are re-opened and registered for Xid events on the new event set)."""
        self._stop.set()
        self._readers.stop()
        if self._thread is not None:
            self._thread.join(self.xid_wait_seconds + 5.0)
            self._thread = None
        # An idle reader ends at once; one hung in the driver keeps its GPU's GPM samples (freeing them under a call
        # that may still use them would be worse than leaving them to the process's exit), and its GPU busy, so that
        # a re-opened source starts no second read of that GPU until the call returns.
        self._readers.join(time.monotonic() + 1.0)
        hung = self._readers.busy()
        self._stale |= hung
        self._answered.clear()
        for index in [i for i in self._gpm if i not in hung]:
            self._gpm.pop(index).free()
        with self._lock:
            # A handle and an event registration belong to this NVML session; the identity read once stays.
            self._handles.clear()
            self._registered.clear()
            self._index_of.clear()
        if not self._open:
            return
        self._open = False
        try:
            if self._events is not None:
                pynvml.nvmlEventSetFree(self._events)
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("NVML shutdown failed", error=describe(err))
        finally:
            self._events = None

    def read_all(self) -> list[GpuReading]:
        """One reading per GPU NVML counts, each read on the GPU's own thread, all within `timeout_seconds`; a
        failing GPU, or one whose read has not returned by then (or is still hung from an earlier poll), gives a
        reading with `error` set and no values."""
        count = int(pynvml.nvmlDeviceGetCount())
        now = time.monotonic()
        deadline = now + self.timeout_seconds
        first = now + max(self.timeout_seconds, FIRST_READ_SECONDS)
        busy = self._readers.busy()
        for index in [i for i in self._stale if i not in busy]:
            # Hung across close(), and returned since: the GPU's GPM samples are of the old session; start afresh.
            self._stale.discard(index)
            gpm = self._gpm.pop(index, None)
            if gpm is not None:
                gpm.free()
        wanted = [index for index in range(count) if index not in busy]
        # A poll of n GPUs fits its deadline if each read that stalls gets a thread of its own within 1/(n+1) of it.
        stall = self.timeout_seconds / (len(wanted) + 1)
        readings = self._readers.poll(wanted, lambda i: deadline if i in self._answered else first, stall)
        out = []
        for index in range(count):
            reading = readings.get(index)
            if reading is not None:
                self._answered.add(index)
            out.append(reading if reading is not None else self._failed(index, unresponsive(self.timeout_seconds)))
        return out

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """Critical Xid events seen since start, per (NVML index, xid)."""
        with self._lock:
            return dict(self._xid)

    def read(self, index: int) -> GpuReading:
        """Every reading of GPU `index`, on the calling thread (read_all() calls it on the GPU's reader)."""
        try:
            handle, known = self._handle(index)
            reading = read_gpu(index, handle, known, self._versions)
            return reading if self.gpm is False else self._read_gpm(index, handle, reading)
        except pynvml.NVMLError as err:
            # A lost GPU fails every call, and may fail again once its handle is re-opened: open it afresh next poll,
            # and its GPM samples with it (freed now: a sample of the GPU before the loss is no interval's start).
            with self._lock:
                self._handles.pop(index, None)
            gpm = self._gpm.get(index)
            if gpm is not None:
                gpm.free()
            return self._failed(index, describe(err))

    def gpm_samples(self) -> int:
        """How many GPM samples jaxmon holds now, over all GPUs (two per sampled GPU or GPU instance)."""
        return sum(gpm.live_samples() for gpm in list(self._gpm.values()))

    def _read_gpm(self, index: int, handle: Any, reading: GpuReading) -> GpuReading:
        """`reading` with the GPU's GPM values and its GPU instances' (gpm.py), on the GPU's reader thread."""
        gpm = self._gpm.get(index)
        if gpm is None:
            gpm = self._gpm[index] = GpuGpm(index, on_unsupported=self._gpm_unsupported)
        migs = reading.mig_devices or ()
        whole, per_instance = gpm.read(handle, {m.gpu_instance for m in migs if m.gpu_instance is not None})
        if migs:
            migs = tuple(
                replace(m, gpm=per_instance.get(m.gpu_instance) if m.gpu_instance is not None else None) for m in migs
            )
        return replace(
            reading,
            gpm_supported=gpm.supported,
            gpm=whole,
            mig_devices=migs if reading.mig_devices is not None else None,
        )

    def _gpm_unsupported(self, index: int, reason: str) -> None:
        """Say once per GPU why it has no GPM series (a warning where --collector.nvml.gpm true asked for them)."""
        with self._lock:
            if index in self._gpm_logged:
                return
            self._gpm_logged.add(index)
        say = log.warning if self.gpm is True else log.info
        say("NVML GPM unsupported: no GPM series for this GPU", gpu=index, reason=reason)

    def _failed(self, index: int, error: str) -> GpuReading:
        """GPU `index`'s reading with `error`: no values, the identity it had (if its handle ever opened)."""
        with self._lock:
            known = self._known.get(index)
        return GpuReading(index=index, error=error) if known is None else known.reading(index, error=error)

    def _handle(self, index: int) -> tuple[Any, Known]:
        with self._lock:
            handle = self._handles.get(index)
            known = self._known.get(index)
        if handle is None or known is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            known = open_known(handle)
            with self._lock:
                self._known[index] = known
                self._handles[index] = handle
            self._register(index, handle)
        return handle, known

    def _register(self, index: int, handle: Any) -> None:
        """Ask for this GPU's critical Xid events (once per handle; unsupported here means no Xid series)."""
        address = _address(handle)
        with self._lock:
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
