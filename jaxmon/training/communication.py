"""Each tracked program's communication and predicted peak memory, read once per program off the training thread.

At a new program's first call the training thread does only what must be done there (`Tracker.measure`): the
cache-hit lowering it does for the cost analysis anyway, and a look at the program's shardings for the mesh and
device order (`JaxTraining.compiled`), then it queues the program (an append: no notify, no thread start). The
rest, `Compiled.as_text()` (megabytes for a large program), its parse (jaxmon.training.hlo) and
`memory_analysis()`, runs here, on one jaxmon thread, which the waiter wakes when it books a step (`kick()`): a
notify from the training thread would hand the GIL to the analysis right there, inside the user's call (measured:
the first call of a tracked function then took 30-120 ms longer). The program's `communication` is None until it
is done, and its steps add no collective bytes and no peak meanwhile (never a guess); no step waits for it.
Nothing here imports JAX.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxmon.threads import PREFIX, Worker
from jaxmon.training.hlo import MeshLayout

# Programs waiting for their analysis at most (each holds its compiled object until then); past it a new program is
# not analysed and counted (reason="communication").
MAX_QUEUED = 64
THREAD_NAME = PREFIX + "programs"
# (op, axes) series per device at most: 7 ops x the axis combinations a mesh's programs use are a handful; a new
# pair past this many is not counted (the spool carries at most 1024).
MAX_PAIRS = 256
# Collective instruction names kept for the sampled traces at most (a large program has hundreds; MAX_PROGRAMS are
# kept): past it a new name is not learnt, and its events are classified by their name's opcode as without any.
MAX_NAMES = 16384


@dataclass(frozen=True)
class Compiled:
    """A tracked program as its first call left it, read on the calling thread: its cost (jaxmon's Cost), the
    compiled object, the user's mesh it ran under and its device assignment (device ids, None where unknown)."""

    cost: Any
    compiled: Any
    mesh: MeshLayout | None
    assignment: tuple[int, ...] | None


@dataclass(frozen=True)
class Communication:
    """One execution of a program on each of its local `devices`: bytes per device by (op, axes), nccl-tests'
    convention (jaxmon.training.hlo; axes comma-joined, "" without a mesh), and XLA's predicted peak memory.
    `collective_names`: the program's collective instructions by name, with their op (what a sampled trace's
    events are named by: jaxmon.profile.read)."""

    collective_bytes: Mapping[tuple[str, str], float]
    peak_memory: int | None
    devices: tuple[tuple[str, int], ...]
    collective_names: Mapping[str, str] = field(default_factory=dict)


class Analyzer:
    """A queue of programs and the jaxmon thread that analyses them, started with the tracker and woken by `kick()`.

    `analyze(compiled)` is JaxTraining.communication; `done(program, communication)` stores the result on the
    tracker's program (an attribute write: the waiter reads it under the tracker's lock, and sees the old None or
    the whole result); `failed(exc)` counts a program whose analysis raised (it then contributes nothing)."""

    def __init__(
        self,
        analyze: Callable[[Compiled], Communication],
        done: Callable[[Any, Communication], None],
        failed: Callable[[str, Exception | None], None],
    ) -> None:
        self._analyze = analyze
        self._done = done
        self._failed = failed
        self._queue: deque[tuple[Any, Compiled]] = deque()
        self._wake = threading.Condition()
        self._running = False  # an analysis is under way
        # Started here (with the tracker, in start() or publish()), not at the first program: a thread's start
        # waits for the thread to run, which would be the training thread's wait.
        self._worker = Worker(THREAD_NAME.removeprefix(PREFIX), self._run, self._notify)
        self._thread = self._worker.start().thread

    def submit(self, program: Any, compiled: Compiled) -> None:
        """Analyse `program` once `kick()`ed; returns at once: a deque's append (atomic), no lock taken."""
        if self._stopping:
            return
        if len(self._queue) >= MAX_QUEUED:
            self._failed(f"more than {MAX_QUEUED} programs wait for their analysis", None)
            return
        self._queue.append((program, compiled))

    def kick(self) -> None:
        """Start on the queued programs (the waiter calls this when it books a step; cheap when none wait)."""
        if self._queue:  # a racy read: a program queued just now is kicked at the next step
            with self._wake:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    self._queue.clear()
                    return
                program, compiled = self._queue.popleft()
                self._running = True
            try:
                self._done(program, self._analyze(compiled))
            except Exception as exc:  # a program jaxmon cannot read: it contributes nothing, the thread goes on
                self._failed("no collectives or peak memory for a tracked program", exc)
            del program, compiled  # the compiled object is not held past its analysis
            with self._wake:
                self._running = False

    def idle(self) -> bool:
        """No program waits (tests and the bench wait for this; training never does)."""
        with self._wake:
            return not self._queue and not self._running

    @property
    def _stopping(self) -> bool:
        return self._worker.stopping

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def stop(self, timeout: float) -> None:
        """End the thread after the analysis it is in (a daemon: a huge program's parse does not hold the exit)."""
        self._worker.stop(timeout)


class CollectiveNames:
    """The collective instructions of every analysed program by name, with their op: the analysis thread adds a
    program's; the sampler's thread reads them all (a copy) when it classifies a trace's events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}

    def analysed(self, program: Any, communication: Communication) -> None:
        """The Analyzer's `done`: learn the program's names, then store its result on it (an attribute write the
        waiter sees whole: the old None or this)."""
        with self._lock:
            for name, op in communication.collective_names.items():
                if name in self._names or len(self._names) < MAX_NAMES:
                    self._names[name] = op
        program.communication = communication

    def __call__(self) -> dict[str, str]:
        with self._lock:
            return dict(self._names)


class WindowMax:
    """The largest value per key over the last `window` steps (a sliding-window maximum: a deque per key of the
    values that can still be the maximum, decreasing). A step is O(its keys) amortized, a read O(keys), whatever
    the window (the tracker reads it under the lock step() takes)."""

    def __init__(self, window: int) -> None:
        self.window = max(int(window), 1)
        self._seq = 0
        self._candidates: dict[Any, deque[tuple[int, float]]] = {}

    def step(self, values: Mapping[Any, float]) -> None:
        """One step, with these values (keys not in it had none at this step)."""
        self._seq += 1
        for key, value in values.items():
            candidates = self._candidates.setdefault(key, deque())
            while candidates and candidates[-1][1] <= value:
                candidates.pop()
            candidates.append((self._seq, value))

    def clear(self) -> None:
        """The window starts again (a restart: the steps before it are not this run's)."""
        self._candidates.clear()

    def maxima(self) -> dict[Any, float]:
        """The largest value of each key among the window's steps; keys with none in the window are absent."""
        oldest = self._seq - self.window + 1
        out: dict[Any, float] = {}
        for key in list(self._candidates):
            candidates = self._candidates[key]
            while candidates and candidates[0][0] < oldest:
                candidates.popleft()
            if candidates:
                out[key] = candidates[0][1]
            else:
                del self._candidates[key]
        return out


def book(
    programs: Iterable[tuple[Any, int]], totals: dict[tuple[str, int], dict[tuple[str, str], float]]
) -> dict[tuple[str, int], float]:
    """One step's calls (program, calls) of tracked programs: each analysed program's bytes x calls added to
    `totals` per local device and (op, axes); returns the largest predicted peak per device among them. A program
    not analysed yet (or that could not be) adds nothing."""
    peaks: dict[tuple[str, int], float] = {}
    for program, count in programs:
        comm: Communication | None = program.communication
        if comm is None:
            continue
        for device in comm.devices:
            if comm.collective_bytes:
                mine = totals.setdefault(device, {})
                for key, nbytes in comm.collective_bytes.items():
                    if key in mine or len(mine) < MAX_PAIRS:
                        mine[key] = mine.get(key, 0.0) + nbytes * count
            if comm.peak_memory is not None and comm.peak_memory > peaks.get(device, -1.0):
                peaks[device] = float(comm.peak_memory)
    return peaks
