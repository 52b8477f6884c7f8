"""An initialised NVML: the handles of every GPU, each GPU read on its own thread under a deadline, and the thread
that counts Xid events.

Around an Xid 79 (a GPU fallen off the bus) NVML calls on that GPU can hang for seconds or longer. Each GPU therefore
has its own reader thread (`_Reader`), and a poll waits for all of them until one deadline: a GPU whose read has not
returned by then reads as failed (no values), and its reader is skipped until that read returns. So a wedged GPU
holds exactly one thread, never a pile of them, and the other GPUs' readings keep arriving at the poll's cadence.
A GPU's first read opens its handle and reads what it gives once (its identity, limits, Xid registration): on a
driver that wakes its GPUs at first use (persistence mode off) that takes seconds, so it gets FIRST_READ_SECONDS
(at least the deadline) and a start-up is not logged as eight unresponsive GPUs.

Thread safety: a GPU's handle and what it gave once (`_handles`, `_known`) are written by that GPU's reader only,
under `_lock` (never held across an NVML call); the Xid watcher's maps are read and written under the same lock. A
GPU's GPM samples (`_gpm`, gpm.py) are used by its reader alone, and freed by `close()` once that reader has ended.

`close()` then `open()` gives a working source again: a new NVML session, the handles opened afresh and registered
on the new event set, the Xid watcher running again. `close()` is meant for when no poll runs (the runtime stops a
collector only once its poll has returned); one that does run meanwhile ends with its GPUs failed, not an exception.
A reader hung in the driver across `close()` stays its GPU's reader (and keeps its GPM samples) until that call
returns: a GPU reads as unresponsive until then, after `open()` too, and never has two reader threads.
`Versions` flags only ever go from True to False (an older call found), whichever reader learns it first.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pynvml
import structlog

from jaxmon.sources.nvml.calls import NvmlUnavailable, Versions, describe, probe_reason
from jaxmon.sources.nvml.device import Known, open_known
from jaxmon.sources.nvml.device import read as read_gpu
from jaxmon.sources.nvml.gpm import GpuGpm
from jaxmon.sources.nvml.readings import GpuReading

log = structlog.get_logger("jaxmon.sources.nvml")


# The budget of a GPU's first read (see the module's docstring), when it is longer than the poll's deadline.
FIRST_READ_SECONDS = 10.0


def unresponsive(timeout: float) -> str:
    """The error of a GPU whose read did not return within the deadline (the same text every poll: logged once)."""
    return f"NVML did not answer within {timeout:g}s (a call on this GPU hangs; its next read starts once it returns)"


@dataclass
class _Reader:
    """GPU `index`'s reader thread: one read at a time, begun by `start()`. A read that hangs keeps it busy, and
    every `start()` refused, until NVML returns."""

    index: int
    read: Callable[[int], GpuReading]
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _wanted: bool = False
    _busy: bool = False
    _stopped: bool = False
    _result: GpuReading | None = None
    _thread: threading.Thread | None = None

    def start(self) -> bool:
        """Begin a read; False while the last one has not returned (nothing is begun then)."""
        with self._cond:
            if self._busy or self._stopped:
                return False
            self._busy = self._wanted = True
            self._result = None
            if self._thread is None:
                # A daemon thread: a read hung in the driver must not keep the process from exiting.
                self._thread = threading.Thread(target=self._run, name=f"jaxmon-nvml-gpu{self.index}", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return True

    def result(self, deadline: float) -> GpuReading | None:
        """The reading begun by `start()`, or None when it has not returned by `deadline` (time.monotonic())."""
        with self._cond:
            self._cond.wait_for(lambda: not self._busy, timeout=max(0.0, deadline - time.monotonic()))
            return None if self._busy else self._result

    def stop(self) -> None:
        """End the thread once its current read (if any) returns; does not wait for it. A read asked for that has
        not begun never will: its `result()` is None at once."""
        with self._cond:
            self._stopped = True
            if self._wanted:
                self._wanted = self._busy = False
            self._cond.notify_all()

    def ended(self) -> bool:
        """True once stopped and its thread has ended (a reader stopped while its read hung ends when it returns)."""
        with self._cond:
            return self._stopped and (self._thread is None or not self._thread.is_alive())

    def join(self, deadline: float) -> bool:
        """Wait until `deadline` (time.monotonic()) for the stopped thread to end; True when it has (or never ran)."""
        if self._thread is None:
            return True
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted or self._stopped)
                if self._stopped:
                    return
                self._wanted = False
            try:
                reading = self.read(self.index)
            except Exception as err:  # read() turns NVML errors into readings; nothing else may end this thread
                reading = GpuReading(index=self.index, error=f"{type(err).__name__}: {err}")
            with self._cond:
                self._result = reading
                self._busy = False
                self._cond.notify_all()


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
    _readers: dict[int, _Reader] = field(default_factory=dict)
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

    def open(self) -> None:
        """Initialise NVML and start the Xid watcher; raises NvmlUnavailable."""
        if self._open:
            return
        self._stop.clear()  # a watcher stopped by close() runs again
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
        readers = list(self._readers.values())
        for reader in readers:
            reader.stop()
        if self._thread is not None:
            self._thread.join(self.xid_wait_seconds + 5.0)
            self._thread = None
        # An idle reader ends at once; one hung in the driver keeps its GPU's GPM samples (freeing them under a call
        # that may still use them would be worse than leaving them to the process's exit), and stays the GPU's
        # reader (stopped), so that a re-opened source starts no second thread on that GPU until the call returns.
        deadline = time.monotonic() + 1.0
        hung = {reader.index for reader in readers if not reader.join(deadline)}
        for index in [i for i in self._readers if i not in hung]:
            del self._readers[index]
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
        readers = {}
        started = {}
        for index in range(count):
            reader = self._readers.get(index)
            if reader is not None and reader.ended():
                # Stopped by close() while its read hung, and that read has returned since: the GPU's GPM samples
                # are of the old session's reader; a new reader starts afresh.
                gpm = self._gpm.pop(index, None)
                if gpm is not None:
                    gpm.free()
                reader = None
            if reader is None:
                reader = self._readers[index] = _Reader(index, self.read)
            readers[index] = reader
            started[index] = reader.start()
        out = []
        for index in range(count):
            waits = deadline if index in self._answered else first
            reading = readers[index].result(waits) if started[index] else None
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
