"""The threads that read the GPUs for jaxmon.sources.nvml.library.Nvml: a queue of GPU reads per poll, taken by
as few threads as keep up (the library module's docstring says why and how a wedged GPU stays one dark GPU)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from jaxmon.sources.nvml.readings import GpuReading


def unresponsive(timeout: float) -> str:
    """The error of a GPU whose read did not return within the deadline (the same text every poll: logged once)."""
    return f"NVML did not answer within {timeout:g}s (a call on this GPU hangs; its next read starts once it returns)"


IDLE_NAME = "jaxmon-nvml-reader"


def reader_name(index: int) -> str:
    """The name of the thread while it reads GPU `index` (the one thread a wedged GPU holds carries it)."""
    return f"jaxmon-nvml-gpu{index}"


@dataclass
class Readers:
    """The threads that read the GPUs: a queue of GPU reads per poll, taken one at a time by as few threads as keep
    up. One thread reads every GPU in turn while each read returns promptly (one wake-up per poll each way, and no
    eight threads handing the GIL around call by call); when no read has returned for `stall` seconds while GPUs
    wait, one more thread joins, so a hung read holds its thread and the GPUs behind it are read by the next. A GPU
    whose read is in flight (`_busy`, from this poll or an earlier one) is not queued again until it returns: one
    thread per wedged GPU, never a pile. Threads stay, idle, for the next poll (at most one per GPU)."""

    read: Callable[[int], GpuReading]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _work: threading.Condition = field(init=False)
    _done: threading.Condition = field(init=False)
    _queue: deque[int] = field(default_factory=deque)
    _busy: set[int] = field(default_factory=set)
    _results: dict[int, GpuReading] = field(default_factory=dict)
    _poll: int = 0  # which poll a read belongs to: a read that returns after its poll ended is dropped
    _expected: int = 0  # how many readings the running poll waits for
    _progress: float = 0.0  # when a read last returned (or the poll began): time.monotonic()
    _idle: int = 0  # threads waiting for work
    _signalled: int = 0  # of those, woken and not yet running
    _threads: list[threading.Thread] = field(default_factory=list)
    _stopped: bool = False

    def __post_init__(self) -> None:
        self._work = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)

    def busy(self) -> set[int]:
        """The GPUs whose read is in flight (a hung one from an earlier poll included)."""
        with self._lock:
            return set(self._busy)

    def poll(self, indexes: list[int], limit: Callable[[int], float], stall: float) -> dict[int, GpuReading]:
        """Read `indexes` (none of them in flight: `busy()`), each until `limit(index)` (time.monotonic()); the
        readings that returned in time, by index. The calling thread wakes when the last one returns, and every
        `stall` seconds while reads wait in the queue (to add a thread where none has returned meanwhile)."""
        with self._lock:
            if self._stopped or not indexes:
                return {}
            self._poll += 1
            self._results = {}
            self._expected = len(indexes)
            self._queue.extend(indexes)
            self._progress = time.monotonic()
            self._wake()
            while not self._stopped and len(self._results) < self._expected:
                now = time.monotonic()
                until = max(limit(i) for i in indexes if i not in self._results)
                if now >= until:
                    break
                if not self._queue:
                    self._done.wait(until - now)
                    continue
                if now - self._progress >= stall:
                    # Every thread is inside a read that has not returned for `stall`: one more takes the queue on.
                    self._progress = now
                    self._wake()
                self._done.wait(min(until - now, max(self._progress + stall - now, 0.001)))
            self._queue.clear()  # a read not begun by the deadline never will: its GPU is failed this poll
            self._poll += 1  # reads still in flight are dropped when they return
            return dict(self._results)

    def stop(self) -> None:
        """End the idle threads now and a busy one when its read returns; does not wait for them."""
        with self._lock:
            self._stopped = True
            self._queue.clear()
            self._work.notify_all()
            self._done.notify_all()

    def restart(self) -> None:
        """Take polls again after stop() (a thread still in a hung read keeps its GPU busy until it returns)."""
        with self._lock:
            self._stopped = False

    def join(self, deadline: float) -> None:
        """Wait until `deadline` (time.monotonic()) for the stopped threads to end (a hung one does not)."""
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def _wake(self) -> None:
        """With the lock held: wake an idle thread for the queue, else start one."""
        if self._idle > self._signalled:
            self._signalled += 1  # so that a second wake before that thread runs wakes another, or starts one
            self._work.notify()
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        if len(self._threads) >= len(self._busy) + len(self._queue):
            return  # a thread for every read in flight or queued already: a woken one has not run yet
        # A daemon thread: a read hung in the driver must not keep the process from exiting.
        thread = threading.Thread(target=self._run, name=IDLE_NAME, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        with self._lock:
            while not self._stopped:
                if not self._queue:
                    self._idle += 1
                    self._work.wait()
                    self._idle -= 1
                    self._signalled = max(0, self._signalled - 1)
                    continue
                index = self._queue.popleft()
                self._busy.add(index)
                poll = self._poll
                self._lock.release()
                me.name = reader_name(index)
                try:
                    reading = self.read(index)
                except Exception as err:  # read() turns NVML errors into readings; nothing else may end this thread
                    reading = GpuReading(index=index, error=f"{type(err).__name__}: {err}")
                finally:
                    me.name = IDLE_NAME
                    self._lock.acquire()
                self._busy.discard(index)
                if poll == self._poll:
                    self._results[index] = reading
                    self._progress = time.monotonic()
                    if len(self._results) == self._expected:
                        self._done.notify_all()
