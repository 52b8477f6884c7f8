"""Sampled traces: every `every` steps, a trace of `steps` whole steps, split per device into compute, exposed
collective, copy and idle time (jaxmon.xla.profile), and traces on demand (`/debug/trace`).

Which steps: a block starts at each step number that is a multiple of `every`, at most one per `min_seconds` of Unix
time (blocks.period_began), so every process of a job traces the same step numbers; a block whose steps hold named
badput (an eval, a save, a compile) is dropped, counted `skipped`, and tried again on the next clean steps
(jaxmon.training.blocks). The trace starts when step `n0 - lead` is handed to `jaxmon.step()` (the training thread
only notes the request: a modulo, a comparison and, once per sample, a notify); `lead` is LEAD, or more where the
profiler's recent starts took longer than the steps in flight (a TPU's can take a few hundred milliseconds): step
`n0`'s window (step `n0 - 1`'s completion to its own) must begin after the trace runs, and a window that began
before is left out (its device may not have been traced yet: it would read idle). The trace stops once the waiter
booked the block's last completion. Start, stop and parse run on this module's thread (`jaxmon-profile`), never on
the training thread; a large trace is read in a child process (jaxmon.training.trace_split), so that its parse does
not hold the GIL.

Nothing here imports JAX: `Profiler` (jaxmon.sources.local.profiler.JaxProfiler) starts and stops the sessions, and
says `Busy` when the user (or another tool) is profiling; jaxmon then counts the sample `busy` and leaves the user's
session alone, and a user's trace started while jaxmon's runs ends jaxmon's first (that module says how).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import structlog

from jaxmon.files import tar_gz
from jaxmon.logsetup import ErrorLog
from jaxmon.sampled_traces import DEMAND_STEP_TIMEOUT, Busy
from jaxmon.threads import Worker
from jaxmon.training.blocks import LEAD, Blocks, block_start, period_began, traced_steps
from jaxmon.training.handed import Profiler, SamplerConfig, TrainingOps
from jaxmon.training.profile_totals import ProfileTotals
from jaxmon.training.trace_links import Catalog
from jaxmon.training.trace_split import IN_PROCESS_BYTES, Reader, Stopped
from jaxmon.training_readings import ProfileReading

log = structlog.get_logger("jaxmon.training.sampler")

__all__ = ["LEAD", "RESULTS", "Busy", "Off", "Sampler", "block_start", "sampler_for", "traced_steps"]

RESULTS = ("taken", "busy", "failed", "skipped")
# How many of its last starts the lead is sized by (the slowest of them).
STARTS = 4
# A sample the job does not finish (it stopped stepping, or steps take long) ends after this many seconds at least,
# and after 4x the block's expected time (the last step's duration x (steps + LEAD)) at most.
MIN_TIMEOUT = 60.0


class Sampler:
    """The sampled traces of one training process (`handed` and `completed` are the tracker's hooks)."""

    def __init__(
        self,
        profiler: Profiler,
        config: SamplerConfig,
        collectives: Callable[[], Catalog] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        problem: Callable[..., None] | None = None,
        in_process: int = IN_PROCESS_BYTES,
    ) -> None:
        """`clock` is the tracker's monotonic clock (its completions are on it); `wall_ns` the Unix clock the trace
        is related to; `collectives` places the tracked programs' collective instructions (trace_links.Catalog);
        `problem` the tracker's (reason, event, times=): counts the events of analysed instructions that could not
        be placed, by why (reason="trace_<why>"); `in_process`: the largest trace read on this thread (bytes; a
        larger one is read in a child process)."""
        self._reader = Reader(in_process)  # stop() kills a child reading a trace
        self.profiler = profiler
        self.config = config
        self._collectives = collectives
        self._problem = problem
        self._clock = clock
        self._wall_ns = wall_ns
        self._errors = ErrorLog(log, 3600.0)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._request: int | None = None  # the block to trace, asked for by handed()
        self._queued = False  # the request came while a sample was under way
        self._block: int | None = None  # the block being traced
        # Which blocks, off badput steps (blocks.py); `blocks.retry`, `modulus` and `watch` are what the tracker's
        # step() checks (hand.py keeps the modulus, the blocks and the watch, which only handed() sets, on its own
        # object), calling handed() only where one of them says a trace may start or stop.
        self.blocks = Blocks(config.every, config.steps)
        self.modulus = config.every if config.every > 0 else 0  # 0: no regular block (no step number starts one)
        # (number, completion) of the last steps: the block's and the one before it, with room for the steps that
        # complete before this thread wakes up to stop the trace.
        self._done: deque[tuple[int, float]] = deque(maxlen=config.steps + LEAD + 64)
        self._completions = 0  # completions booked (for traces on demand)
        self._period: int | None = None  # the min_seconds period of the last block start (handed())
        self._last_duration: float | None = None
        self._back = False  # a step number went back since the sample started
        self._results = dict.fromkeys(RESULTS, 0)
        self._totals = ProfileTotals()
        self._session = threading.Lock()  # one jaxmon trace at a time: a sample or one on demand
        self._demands = 0  # traces on demand waiting: completed() wakes this thread for them or a sample only
        # The step before a block's last (-1: none): its hand-off calls `look` (the tracker's: the next step is looked
        # at as it comes), so the trace stops at the block's end, not hundreds of short steps later (a long look).
        self.watch = -1
        self.look: Callable[[], None] = _nothing
        # The last host step number handed to jaxmon.step() (the tracker's hand; None: none, or a device's): a block
        # asked for while the last sample stopped is busy if the job reached it meanwhile.
        self.dispatched: Callable[[], int | None] = _none
        # How many steps before its block a trace is asked for (LEAD at least): the profiler's start took that many
        # steps' time of late (a TPU's can take hundreds of milliseconds), so that the block's first window begins
        # after the trace did. At most `every - steps`: a block's trace is asked for after the last one's block.
        self.lead = LEAD
        self._asked = 0.0  # when the last block was asked for (the tracker's clock)
        self._asked_at = 0  # the step whose hand-off asked for it
        self._asked_block = 0  # the last regular block handed() considered
        self._starts: deque[float] = deque(maxlen=STARTS)  # the profiler's last starts: from the ask to running
        self._worker = Worker("profile", self._run, self._notify)
        self._thread = self._worker.start().thread

    # -- the tracker's hooks ------------------------------------------------------------------------------

    def handed(self, number: int) -> None:
        """Step `number` was handed to jaxmon.step() (the training thread: O(1), no JAX, no call, no lock but once per
        sample and its retries)."""
        if number == self.watch:  # the step before a traced block's last: the last is looked at as it comes
            self.watch = -1
            self.look()
        # The next regular block at least LEAD steps on, asked for from `lead` steps before it (the hand calls at
        # number + its copy of the lead, which may be an older, shorter one), once; or the retry block (blocks.py).
        modulus, lead, retry = self.modulus, self.lead, self.blocks.retry
        n0 = -(-(number + LEAD) // modulus) * modulus if modulus else 0
        if retry is not None and number + LEAD <= retry <= number + lead:
            n0 = retry
        elif not modulus or n0 - number > lead or n0 == self._asked_block:
            return
        else:
            self._asked_block = n0
        if n0 <= 0 or self.config.every <= 0:
            return
        if self.config.min_seconds > 0 and n0 != self.blocks.retry:  # a retry belongs to its regular block's period
            began, self._period = period_began(self._period, self._wall_ns(), self.config.min_seconds)
            if not began:
                return
        with self._lock:
            if self._request is None:  # the sample under way, if one, ends within its steps: this one comes next
                if self.blocks.begin(n0):
                    self._request, self._queued = n0, self._block is not None
                    self._asked, self._asked_at = self._clock(), number
                    self.watch = n0 + self.config.steps - 2  # the block's last step - 1 (> number: LEAD is 2)
                    self._wake.notify_all()
                else:  # a badput() block still open covers it: no trace
                    self._results["skipped"] += 1
                    self.blocks.finish(n0)

    def completed(self, numbers: Sequence[int], at: Sequence[float]) -> None:
        """The waiter booked these steps (their numbers, their completions on the tracker's clock), a batch in order:
        two columns, so that a long batch makes no tuple a step (its tail only, while no sample is under way)."""
        if not numbers:
            return
        with self._lock:
            if self._block is not None:  # a sample under way: whether its step numbers went back
                for number, when in zip(numbers, at, strict=True):
                    if self._done and number <= self._done[-1][0]:
                        self._back = True
                    self._done.append((number, when))
            else:  # only the last ones are kept (deque maxlen)
                keep = -(self._done.maxlen or 1)
                self._done.extend(zip(numbers[keep:], at[keep:], strict=True))
            if len(self._done) > 1 and self._done[-2][0] == self._done[-1][0] - 1:
                self._last_duration = self._done[-1][1] - self._done[-2][1]
            self._completions += len(numbers)
            if self._block is not None or self._demands:
                self._wake.notify_all()

    def badput(self, kind: str, key: Hashable, handed: int | None, whole: bool) -> None:
        """An interval of named badput opened (or was recorded `whole`) after step `handed` was handed: a sample
        whose steps it marks is dropped (blocks.py). Called per interval, never per step."""
        with self._lock:
            self.blocks.opened(kind, key, handed, whole)
            if self._block is not None and self.blocks.marked(self._block):
                self._wake.notify_all()  # the sample under way is dropped: end its trace now

    def closed(self, key: Hashable, handed: int | None) -> None:
        """The open interval `key` closed after step `handed` was handed."""
        with self._lock:
            self.blocks.closed(key, handed)
            if self._block is not None and self.blocks.marked(self._block):
                self._wake.notify_all()  # it reached the sample under way: end its trace now

    # -- the sampler's thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._request is None and not self._stopping:
                    self._wake.wait()
                n0 = self._request
                if n0 is None or self._stopping:
                    return
                self._block, self._request = n0, None
                asked, asked_at = self._asked, self._asked_at
                if self._queued and self._reached(n0, asked_at):  # the last one ended too late
                    self._results["busy"] += 1  # jaxmon's own sample held the profiler until the job reached it
                    self._block = None
                    self.blocks.finish(n0)
                    continue
            try:
                self._sample(n0, asked)
            except Exception as exc:  # a bug here must not end the sampling (nor reach training)
                self._count("failed")
                self._errors.error("error", "a sampled trace failed", f"{type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self._block = None
                    self.blocks.finish(n0)

    def _reached(self, n0: int, asked_at: int) -> bool:
        """Block `n0`, asked for at step `asked_at`'s hand-off while the sample before it stopped, can no longer be
        traced whole: its steps ran, or the job handed steps since the ask, into the lead (a trace started now would
        run after its first window began: on a TPU v5e chip, steps of 16 ms asked for every 40 while the last trace's
        0.6 s stop ran). Lock held."""
        if self._done and self._done[-1][0] >= n0 - 1:
            return True
        handed = self.dispatched()
        return handed is not None and handed > asked_at and n0 - handed < self.lead

    def _count(self, result: str) -> None:
        with self._lock:
            self._results[result] += 1

    def _sample(self, n0: int, asked: float) -> None:
        """Trace block `n0`, asked for at `asked` (the tracker's clock)."""
        last = n0 + self.config.steps - 1
        if not self._session.acquire(blocking=False):
            return  # a trace on demand runs: it is the sample's trace of these steps, not the user's
        try:
            # The profiler's own start from here: a block asked for while the sample before it ended (a TPU's
            # profiler takes 0.6 s to stop) waited for this thread, which no earlier ask would shorten.
            began = max(self._clock(), asked)
            try:
                self.profiler.start(python=False)
            except Busy:
                self._count("busy")
                return
            started = self._clock()
            with self._lock:
                self._back = False
                self._lead_after(started - began)
                expected = (self._last_duration or 0.0) * (self.config.steps + self.lead)
                deadline = started + max(MIN_TIMEOUT, 4 * expected)
                while not self._stopping and not self._finished(last) and not self.blocks.marked(n0):
                    left = deadline - self._clock()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                books = dict(self._done)
            try:
                data = self.profiler.stop()
            except Busy:
                self._count("busy")
                return
            # The completions are on the monotonic clock; the trace is on the Unix clock: relate them now.
            mono, wall = self._clock(), self._wall_ns()
        finally:
            self._session.release()
        if self._stopping:
            return  # stopped inside the block: its steps did not all come, and the exit need not wait for a parse
        with self._lock:
            if self.blocks.held(n0):  # named badput in its steps: dropped unread, tried again on clean steps
                self._results["skipped"] += 1
                return
        # A step's window counts where it began once the trace ran (the trace's own start time may be stamped
        # before its device tracer ran: a window before that reads the device idle).
        traced = [k for k in traced_steps(n0, self.config.steps) if k - 1 in books and k in books]
        windows = [(books[k - 1], books[k]) for k in traced if books[k - 1] >= started]
        if not windows:
            self._unwhole(n0, len(traced), start_seconds=round(started - asked, 3), lead=self.lead)
            return
        self._book(n0, data, [(wall - round((mono - a) * 1e9), wall - round((mono - b) * 1e9)) for a, b in windows])

    def _unwhole(self, n0: int, steps: int, start_seconds: float | None = None, lead: int | None = None) -> None:
        """A sample that holds none of its steps whole: failed, and said (at most once an hour)."""
        self._count("failed")
        self._errors.error(
            "window",
            "a sampled trace holds none of its steps whole (the job ran ahead of the trace's start, or stopped "
            "stepping)",
            "window",
            block=n0,
            steps=steps,
            start_seconds=start_seconds,
            lead=lead,
        )

    def _lead_after(self, start: float) -> None:
        """Size the lead by the profiler's slowest recent start (`start`: this one's, from the ask to running) in
        whole steps of the loop's last duration, on top of LEAD; lock held. Asked for as step `n0 - lead` is handed, the
        trace must run before step `n0 - 1` completes, `lead - 1` steps later at least: LEAD + floor(start / duration)
        steps leave more than the start (a start shorter than a step leaves the lead at LEAD)."""
        self._starts.append(max(start, 0.0))
        if self._last_duration and self._last_duration > 0 and self.config.every > 0:
            late = math.floor(max(self._starts) / self._last_duration)
            self.lead = max(LEAD, min(LEAD + late, self.config.every - self.config.steps))
            self.blocks.lead = self.lead

    def _finished(self, last: int) -> bool:
        """The block's last completion is booked (or numbers went past it, or back: the job restarted)."""
        return self._back or (bool(self._done) and self._done[-1][0] >= last)

    def _book(self, n0: int, data: bytes, windows: list[tuple[int, int]]) -> None:
        """Split the trace over the steps' windows (Unix ns) and add each device's parts to the totals."""
        try:
            add = self._reader.split(data, self._catalog(), windows)  # a large trace: in a child process
        except Stopped:
            return  # stop() ended the read: the exit waits for no parse
        if add is None:
            self._unwhole(n0, len(windows))
            return
        keys = self.profiler.devices()
        with self._lock:
            unplaced = self._totals.add(add, keys, n0)
            self._results["taken"] += 1
        for why, count in sorted(unplaced.items()):
            if self._problem is not None:
                self._problem(
                    f"trace_{why}",
                    'sampled collective events of analysed instructions not placed: axes="", link="unknown"',
                    times=count,
                )

    def _catalog(self) -> Catalog:
        """The tracked programs' collective instructions, placed (none: events classified by their opcode)."""
        if self._collectives is None:
            return Catalog()
        try:
            return self._collectives()
        except Exception:
            return Catalog()

    # -- traces on demand ---------------------------------------------------------------------------------

    def demand(self, directory: Path, steps: int | None = None, seconds: float | None = None) -> bytes:
        """Trace `steps` whole steps (or `seconds`) into `directory` and answer it as a gzip tar (XProf and Perfetto
        open it as it is). Raises Busy when the user is profiling, TimeoutError when the steps do not come, and
        RuntimeError when another trace of jaxmon's runs (a sample ends within its steps: the caller may retry)."""
        if not self._session.acquire(timeout=MIN_TIMEOUT):
            raise RuntimeError("jaxmon's own sampled trace did not end: try again later")
        try:
            self.profiler.start(python=True)
            try:
                self._wait_for(steps, seconds)
            finally:
                self.profiler.export(directory)
        finally:
            self._session.release()
        return tar_gz(directory)

    def _wait_for(self, steps: int | None, seconds: float | None) -> None:
        if steps is None:
            time.sleep(seconds or 0.0)
            return
        with self._lock:
            # The first completion after the start opens the first whole step; `steps` more close them.
            target = self._completions + steps + 1
            deadline = self._clock() + DEMAND_STEP_TIMEOUT
            self._demands += 1
            try:
                while self._completions < target and not self._stopping:
                    left = deadline - self._clock()
                    if left <= 0:
                        raise TimeoutError(f"the job completed no {steps} steps in {DEMAND_STEP_TIMEOUT:.0f} s")
                    self._wake.wait(left)
            finally:
                self._demands -= 1

    # -- reading ------------------------------------------------------------------------------------------

    @property
    def block(self) -> int | None:
        """The block asked for or traced now (its sample not yet counted), None when none is."""
        with self._lock:
            return self._request if self._request is not None else self._block

    def reading(self) -> ProfileReading | None:
        """The samples' counts and each device's totals; None when sampling is off (traces on demand only)."""
        if self.config.every <= 0:
            return None
        with self._lock:
            return ProfileReading(
                results=dict(self._results), devices=self._totals.devices(), sample_step=self._totals.sample_step
            )

    @property
    def _stopping(self) -> bool:
        return self._worker.stopping

    def _notify(self) -> None:
        with self._lock:
            self._wake.notify_all()

    def stop(self, timeout: float) -> None:
        self._reader.stop()
        self._worker.stop(timeout)

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return (self._worker.thread,)


def _nothing() -> None:
    pass


def _none() -> None:
    return None


class Off:
    """No usable jax.profiler: hooks that do nothing, and no trace on demand."""

    threads: tuple[threading.Thread, ...] = ()
    block: int | None = None
    blocks = Blocks(0, 1)  # no block asked for: no retry
    modulus = 0
    watch = -1
    lead = LEAD
    look: Callable[[], None] = staticmethod(_nothing)
    dispatched: Callable[[], int | None] = staticmethod(_none)

    def handed(self, number: int) -> None: ...
    def completed(self, numbers: Sequence[int], at: Sequence[float]) -> None: ...
    def badput(self, kind: str, key: Hashable, handed: int | None, whole: bool) -> None: ...
    def closed(self, key: Hashable, handed: int | None) -> None: ...
    def reading(self) -> None: ...
    def stop(self, timeout: float) -> None: ...

    def demand(self, directory: Path, steps: int | None = None, seconds: float | None = None) -> bytes:
        raise RuntimeError("jax.profiler cannot be used in this process (the log said why at start)")


def sampler_for(
    ops: TrainingOps,
    config: SamplerConfig,
    clock: Callable[[], float],
    collectives: Callable[[], Catalog] | None = None,
    problem: Callable[..., None] | None = None,
) -> Sampler | Off:
    """The tracker's sampler (`config.every` 0: traces on demand only); `ops.profiler()`
    (jaxmon.sources.local.training) makes the JAX side; `collectives` places the tracked programs' collective
    instructions; `problem` counts what could not be placed. Off when this JAX's profiler cannot be used (said
    once, in the log)."""
    try:
        config = SamplerConfig(max(config.every, 0), max(config.steps, 1), max(config.min_seconds, 0.0))
        return Sampler(ops.profiler(), config, collectives, clock=clock, problem=problem)
    except Exception as exc:
        log.warning("no sampled traces: jax.profiler cannot be used here", error=f"{type(exc).__name__}: {exc}")
        return Off()
