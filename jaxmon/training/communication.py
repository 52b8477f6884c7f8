"""Each tracked program's communication and predicted peak memory, read once per program off the training thread.

At a new program's first call the training thread does only what must be done there (`Tracker.measure`): the
cache-hit lowering it does for the cost analysis anyway, and a look at the program's shardings for the mesh and
device order (`JaxTraining.compiled`), then it queues the program (an append: no notify, no thread start). The
rest, `Compiled.as_text()` (megabytes for a large program), its parse (jaxmon.xla.hlo) and
`memory_analysis()`, runs here, on one jaxmon thread, which the waiter wakes when it books a step (`kick()`): a
notify from the training thread would hand the GIL to the analysis right there, inside the user's call (measured:
the first call of a tracked function then took 30-120 ms longer). The program's `communication` is None until it
is done: its calls meanwhile are counted (by the waiter, per step) and their bytes added once it is (`book()`), and
its steps add no peak meanwhile (never a guess); no step waits for it. A program whose analysis fails gets NOTHING.
Nothing here imports JAX.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxmon.threads import PREFIX, Worker
from jaxmon.training.trace_links import Catalog, ProgramPlaces
from jaxmon.xla.hlo import MeshLayout

# Programs waiting for their analysis at most (each holds its compiled object until then); past it a new program is
# not analysed and counted (reason="communication").
MAX_QUEUED = 64
THREAD_NAME = PREFIX + "programs"
# (op, axes, link) series per device at most: 7 ops x the axis combinations a mesh's programs use (one link each)
# are a handful; a new one past this many is not counted (the spool carries at most 1024).
MAX_PAIRS = 256
# Collective instructions kept for the sampled traces at most (a large program has hundreds; MAX_PROGRAMS are
# kept): past it a new program's are not learnt, and its events are classified by their name's opcode as without.
MAX_NAMES = 16384
# Programs whose calls wait for their analysis at most (book()): those queued (MAX_QUEUED) and the few whose
# analysis failed or was never submitted.
MAX_WAITING = 4 * MAX_QUEUED


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
    """One execution of a program on each of its local `devices`: bytes per device by (op, axes, link), nccl-tests'
    convention (jaxmon.xla.hlo; axes comma-joined, "" without a mesh; link: jaxmon.training.links), and XLA's
    predicted peak memory. `collective_names`: the program's collective instructions by name, with their op (what a
    sampled trace's events are named by: jaxmon.xla.profile.read); `places`: each one's (op, axes, link), `sizes` its
    bytes per device and execution; `unknown_links`: its collectives whose link could not be read, by why; `module`
    its HLO module's name and `program_id` the id a trace's events of it carry (None: not known, or the platform's
    traces use another), which tell its instructions from another program's of the same names."""

    collective_bytes: Mapping[tuple[str, str, str], float]
    peak_memory: int | None
    devices: tuple[tuple[str, int], ...]
    collective_names: Mapping[str, str] = field(default_factory=dict)
    places: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    sizes: Mapping[str, float] = field(default_factory=dict)
    unknown_links: Mapping[str, int] = field(default_factory=dict)
    module: str = ""
    program_id: int | None = None


# What a program whose analysis failed (or was never made) contributes: no bytes, no peak.
NOTHING = Communication({}, None, ())


class Analyzer:
    """A queue of programs and the jaxmon thread that analyses them, started with the tracker and woken by `kick()`.

    `analyze(compiled)` is JaxTraining.communication; `done(program, communication)` stores the result on the
    tracker's program (an attribute write: the waiter reads it under the tracker's lock, and sees the old None or
    the whole result); `failed(exc)` counts a program whose analysis raised (it then contributes nothing);
    `problem` counts the collectives whose link is unknown, by why (reason="link_<why>": jaxmon.training.links)."""

    def __init__(
        self,
        analyze: Callable[[Compiled], Communication],
        done: Callable[[Any, Communication], None],
        failed: Callable[[str, Exception | None], None],
        problem: Callable[..., None] | None = None,
    ) -> None:
        self._analyze = analyze
        self._problem = problem  # the tracker's: (reason, event, times=) counted and logged
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
            program.communication = NOTHING  # its calls wait for no analysis (book())
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
                communication = self._analyze(compiled)
                if self._problem is not None:
                    for why, count in communication.unknown_links.items():
                        self._problem(f"link_{why}", 'collectives whose link is not known: link="unknown"', times=count)
                self._done(program, communication)
            except Exception as exc:  # a program jaxmon cannot read: it contributes nothing, the thread goes on
                self._failed("no collectives or peak memory for a tracked program", exc)
                program.communication = NOTHING
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

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return (self._worker.thread,)


class CollectiveNames:
    """The collective instructions of every analysed program, placed, per program: the analysis thread adds a
    program's; the sampler's thread reads them (`catalog()`, rebuilt only when a program was added) when it
    classifies a trace's events (jaxmon.training.trace_links)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._programs: list[ProgramPlaces] = []
        self._names = 0
        self._catalog: Catalog | None = Catalog()
        self._known: set[int] = set()  # id() of the communications learnt

    def analysed(self, program: Any, communication: Communication) -> None:
        """The Analyzer's `done`: learn the program's places, then store its result on it (an attribute write the
        waiter sees whole: the old None or this)."""
        self.learn(communication)
        program.communication = communication

    def learn(self, communication: Communication) -> None:
        """Learn a program's places, once: one analysed for this tracker, or for a tracker before it in this
        process (its tracked function keeps the program: a start() after a stop() analyses it no more)."""
        places = {name: (*place, communication.sizes.get(name, 0.0)) for name, place in communication.places.items()}
        with self._lock:
            if id(communication) in self._known:
                return
            self._known.add(id(communication))
            if places and self._names + len(places) <= MAX_NAMES:
                self._programs.append(ProgramPlaces(communication.module, communication.program_id, places))
                self._names += len(places)
                self._catalog = None

    def programs(self) -> list[ProgramPlaces]:
        """The analysed programs' places, in the order analysed."""
        with self._lock:
            return list(self._programs)

    def catalog(self) -> Catalog:
        """The places of every analysed program, by program and instruction."""
        with self._lock:
            if self._catalog is None:
                self._catalog = Catalog(self._programs)
            return self._catalog


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

    def steps(self, values: Mapping[Any, float], steps: int) -> None:
        """`steps` steps (a batch the waiter booked), the largest values among them these: kept as the last step's
        (the window's edge is exact to a batch)."""
        if steps > 1:
            self._seq += steps - 1
        self.step(values)

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
    programs: Iterable[tuple[Any, int]],
    totals: dict[tuple[str, int], dict[tuple[str, str, str], float]],
    waiting: dict[int, tuple[Any, int]] | None = None,
) -> dict[tuple[str, int], float]:
    """One step's calls (program, calls) of tracked programs: each analysed program's bytes x calls added to
    `totals` per local device and (op, axes, link); returns the largest predicted peak per device among them.

    Every call counts: the calls of a program not analysed yet wait in `waiting` (program id -> (program, calls)),
    and each step books those whose analysis has completed since, at their bytes per call. A program whose
    analysis failed keeps waiting at no cost but its entry (a bounded number: MAX_QUEUED programs are analysed at
    once, the rest counted and never submitted). Runs on the waiter thread: the training thread only counted."""
    peaks: dict[tuple[str, int], float] = {}
    if waiting:
        ready = [(k, p, n) for k, (p, n) in waiting.items() if p.communication is not None]
        for k, program, count in ready:
            del waiting[k]
            _add(program.communication, count, totals)
    for program, count in programs:
        comm: Communication | None = program.communication
        if comm is None:
            if waiting is not None and getattr(program, "cost", None) is not None and len(waiting) < MAX_WAITING:
                _, before = waiting.get(id(program), (program, 0))
                waiting[id(program)] = (program, before + count)
            continue
        _add(comm, count, totals)
        for device in comm.devices:
            if comm.peak_memory is not None and comm.peak_memory > peaks.get(device, -1.0):
                peaks[device] = float(comm.peak_memory)
    return peaks


def _add(comm: Communication, count: int, totals: dict[tuple[str, int], dict[tuple[str, str, str], float]]) -> None:
    if not comm.collective_bytes:
        return
    for device in comm.devices:
        mine = totals.setdefault(device, {})
        for key, nbytes in comm.collective_bytes.items():
            if key in mine or len(mine) < MAX_PAIRS:
                mine[key] = mine.get(key, 0.0) + nbytes * count
