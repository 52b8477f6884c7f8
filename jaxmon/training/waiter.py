"""jaxmon's waiter thread: it takes the steps `step()` handed (hand.py's protocol), waits for the held ones, dates
and reads them, and hands the tracker runs of steps to book (ledger.py).

A look comes at most once per `every` while steps come: LOOK, or, for a loop whose steps come more often, a LOOK
longer each look while it steps on, up to LOOK_MAX and about LOOK_STEPS steps (a look costs a wake, a wait that
releases and takes back the GIL, and a booking, shared by the steps since the last one). It asks for a hold: the
next step() takes jaxmon's own handles on its arrays and wakes this thread, which takes every item up to the last
hold and waits for the holds in one call. The newest usually still runs (the host dispatches ahead of its device):
its completion is seen when the wait returns. No step for `still` after the ask: the loop paused or ended, and its
steps since the last hold are taken without one.

The steps are cut into segments where the host paused (the steps before a PAUSED completed before the step after it,
those before a Done by its time) or a hold failed (a ready array deleted or donated: the steps up to it are unready),
and each is dated by dating.apportion from observations only: the completion seen (or a Done's or a Found's
time, where the training thread found the newest complete first), the hand-offs, the host's lead, whether the host
waits for its device (it called again within the GIL's switch interval of a completion seen, or its lead holds),
and a typical step's device time (the median of those observed; before any, the least time from a held step's
hand-off to its completion seen, or to a look that found it done). A still loop's steps handed after the last hold
wait for its next call at the stall threshold's pace: a pause() marks when its host stopped; where none comes, a
barrier on every device says when its device was done with them. A look's steps are lists of floats and ints,
and its own objects are made with the cyclic GC off: a look of thousands of steps makes it collect no more than
the loop does.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import itertools
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from jaxmon.threads import Worker
from jaxmon.training.dating import apportion
from jaxmon.training.hand import HOST, LOST, PAUSED, Done, Found, Given, Hand, Hold, handles, shown
from jaxmon.training.handed import TrainingOps
from jaxmon.training.ledger import Run, usable

LOOK = 0.02  # the shortest time between two looks while steps come (seconds)
LOOK_MAX = 0.5  # the longest
LOOK_STEPS = 2000  # the most steps a look waits for: past them a batch costs more than a look
RECENT = 8  # the looks whose least lead is the host's
FIELDS = ("step", "examples", "tokens", "model_flops")
MARKERS = (Given, Hold, Done, Found)  # the items handed that are no step (PAUSED neither)


class Taken(NamedTuple):
    """A look's steps as columns: their hand-off times; where each Given begins (the index of its first step, the
    Given, that step's place in it); the holds (the index of the step held, a Hold or a Given with arrays); the
    pauses (the index of the step handed after one); the marks (a step's index: its Done's time); the orphans (holds
    first in the look, whose steps a look before booked unheld: a pause() that raced the waiter's still loop)."""

    handed: list[float]
    starts: list[int]
    givens: list[Given]
    offsets: list[int]
    held: list[int]
    holds: list[Hold | Given]
    pauses: list[int]
    marks: dict[int, float]
    orphans: list[Hold | Given]


class Signal:
    """threading.Event's set, clear and wait, set by one C call (a lock's release): the training thread's wake of
    the waiter costs it no Python of the Event's (a lock, a condition and its waiters: 2-3 times a release, cold)."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # held: not set

    def set(self) -> None:
        # (not contextlib.suppress: a context manager's objects cost tens of microseconds cold, after a long step)
        try:  # noqa: SIM105
            self._lock.release()
        except RuntimeError:  # set already
            pass

    def clear(self) -> None:
        self._lock.acquire(blocking=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Until set (it stays set), or `timeout` seconds; whether it is set."""
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False
        self.set()
        return True


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The cyclic GC off, where it was on, while this thread makes and lets go of a look's objects (never across a
    wait for a device)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Waiter:
    """The thread that books the handed steps: `book(runs, loss, (loss_step, left_out))` under the tracker's lock;
    `typical()` a step's typical observed device time and `last_done()` the last completion booked (the ledger's);
    `stall_factor` the tracker's (a step longer than this many typical steps stalled);
    `problem(reason, event, ...)` counts and logs."""

    def __init__(
        self,
        hand: Hand,
        handed: deque[Any],
        ops: TrainingOps,
        clock: Callable[[], float],
        book: Callable[[list[Run], dict[str, float] | None, tuple[int | None, int]], None],
        problem: Callable[..., None],
        typical: Callable[[], float | None],
        last_done: Callable[[], float | None],
        stall_factor: float,
    ) -> None:
        self._hand, self._handed, self.ops, self._clock = hand, handed, ops, clock
        self._book, self._problem, self._typical, self._last_done = book, problem, typical, last_done
        self._stall_factor = stall_factor
        self._given, self._offset = Given(None, None, None, None, ()), 0  # what the next step handed is given
        self._leads: deque[int] = deque(maxlen=RECENT)  # the host's lead at each look (none made up)
        self._bounds: deque[float] = deque(maxlen=RECENT)  # a held step's hand-off to its completion seen, or a look
        self._loss: tuple[Hold, int | None] | None = None  # the newest hold naming loss scalars, not read yet
        self._loss_read = -math.inf
        self.every = self.still = LOOK
        self.room = LOOK_STEPS
        self.looks = self.taken = self.booked = 0  # looks that took steps; steps taken, not booked; booked
        self.holds = 0  # the Holds taken (the hand hands a due one only where it handed one more at most)
        self._kept = 0  # the most objects a held step of the last look kept until it: its Given and its clones
        self._young: int | None = None  # the young generation's count after the last look that took held steps
        self._grown: deque[int] = deque(maxlen=RECENT)  # its growth a step taken before each of the last looks
        self._hurry = False
        self._next_look = -math.inf  # the real monotonic clock
        self._deadline = 0.0  # stop()'s
        self._flush: tuple[float, threading.Event] | None = None  # flush()'s deadline, and its done
        self._wake = Signal()
        self._worker = Worker("training", self._run, self._wake.set)
        self.thread = self._worker.thread

    def start(self) -> None:
        """Start the thread (once the hand is armed: its first look asks for a hold)."""
        self._worker.start()

    def wake(self) -> None:
        """A held step was handed."""
        self._wake.set()

    def hurry(self) -> None:
        """Take the steps now."""
        self._hurry = True
        self._wake.set()

    def look_now(self) -> None:
        """The next step held and taken as it comes (the training thread: a sampled trace's last step is next)."""
        self._hand.answered = self
        self._hurry = True

    def stop(self, timeout: float) -> None:
        """Book what was handed (waiting for its holds `timeout` at most), then end."""
        self._deadline = time.monotonic() + timeout
        self._worker.stop(timeout)

    def flush(self, timeout: float) -> bool:
        """Book every step handed by now (waiting for their holds `timeout` at most); whether it did in time."""
        done = threading.Event()
        self._flush = (time.monotonic() + timeout, done)
        self.hurry()
        return done.wait(timeout)

    def _run(self) -> None:
        while not self._worker.stopping:
            self._guarded(self._look)
        self._guarded(lambda: self._drain(self._deadline))

    def _guarded(self, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as exc:  # a bug here must not end the telemetry (nor reach training)
            self._problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")
        finally:
            self.taken = 0
            self._hand.waiting = None

    def _look(self) -> None:
        while not self._hurry and (wait := self._next_look - time.monotonic()) > 0:
            self._wake.clear()
            self._wake.wait(wait)
            if self._worker.stopping:
                return
        self._hurry = False
        self._wake.clear()
        if (flush := self._flush) is not None:
            self._flush = None
            self._drain(flush[0])
            flush[1].set()
            return
        self._hand.asked = object()
        if not self._wake.wait(self.still):  # no step for `still`: the loop paused or ended
            size = len(self._handed)  # the items looked at: the training thread appends after them
            if not self._held(size):
                if size:
                    self._book_unheld(size, paused=True)
                    return
                self._hand.let_go()  # its newest hold, taken already: step() looks at it no more
                self._flush_loss()
                self._wake.wait()  # until a step comes (it is held: asked) or stop
            if self._worker.stopping:
                return
        now = time.monotonic()
        if count := self._held(len(self._handed)):
            young = gc.get_count()[0]  # before this look's own objects: the loop's and its held steps' since the last
            taken = self._take(count)
            if taken is not None:
                spacing = taken[1]
                self.still = LOOK + spacing  # a pause is a step() this much later than its steps come
                # Half the young generation's room left now (the other half is this thread's while it books), filled
                # by the objects held steps keep until a look: a step holding arrays hurries the look past `room`.
                # A held step keeps its Given and its clones, and what the arrays bring with them (objects the
                # installed JAX and NumPy make: a JAX number made and held kept 1.2 young objects on jax 0.10.2 and
                # NumPy 2.4, 3.2 on jax 0.10.0 and NumPy 2.0, where the Given and its clone are 2): the young
                # generation's growth a step since the last look counts them, the loop's own included (test_holds.py
                # at the dependency floors: 4-7 objects a step of two JAX numbers, 2-14 more collections without).
                # The most of the last RECENT looks' (a look's own reads vary with when the loop freed its objects).
                if self._kept and self._young is not None and young > self._young and self.taken:
                    self._grown.append(math.ceil((young - self._young) / self.taken))
                if self._kept and self._grown:
                    self._kept = max(self._kept, *self._grown)
                left = gc.get_threshold()[0] - gc.get_count()[0]
                self.room = max(int(left / 2 / self._kept), 1) if self._kept else LOOK_STEPS
                self._young = gc.get_count()[0]
                # Longer looks for a loop whose steps come more often than LOOK: a look per step for one whose steps
                # are longer (each seen complete; a look's cost is then a small part of a step).
                longer = min(self.every + LOOK, LOOK_MAX, max(LOOK, min(LOOK_STEPS, self.room) * spacing))
                self.every = longer if spacing < LOOK else LOOK
                self._hand.paused_after = self.still
        self._next_look = now + self.every

    def _held(self, size: int) -> int:
        """How many of the first `size` items to take: up to the last hold among them (0: none)."""
        for back in range(size - 1, -1, -1):
            item = self._handed[back]
            if type(item) is Hold:
                return back + 1
            if type(item) is Given and item.arrays and back + 1 < size:
                return back + 2  # with its step
        return 0

    def _take(self, count: int, deadline: float | None = None) -> tuple[int, float] | None:
        """Take `count` items (up to a hold), wait for their holds, date and book their steps; how many, and the
        loop's spacing between them (None: fewer than two)."""
        # The hold this look waits for, said before its items leave the deque: a badput() opening from now on finds
        # it there or here, and says where it was complete already (a Done: hand.pause()).
        last = self._handed[count - 1]
        self._hand.waiting = last if type(last) is Hold else self._handed[count - 2]
        with quiet():
            taken = self._parse([self._handed.popleft() for _ in range(count)])
        handed = taken.handed
        self.taken = len(handed)
        if taken.orphans:  # waited for all the same: every hold handed is (its step is booked already)
            self._wait(taken.orphans, deadline)
        if not handed:
            self._hand.waiting = None
            return None
        self.looks += 1
        newest = taken.holds[-1]
        try:
            ran = not self.ops.ready(handles(newest))  # still running: seen complete when the wait returns
        except Exception:
            ran = False
        looked = self._clock()
        ends = self._wait(taken.holds, deadline)
        self._hand.waiting = None
        seen = ends[-1] if ran else None
        with quiet():
            after = list(self._handed)
            if (by := self._found(after, newest)) is not None:
                looked, seen = min(looked, by), None if seen is None else min(seen, by)
            # The host's lead: its calls while the newest ran, not those within a GIL switch interval of its
            # completion seen (a loop that waited for it calls right after it, before this thread had the GIL back);
            # the least of recent looks'. Paced if it holds; if it grows, not.
            ran_until = seen - sys.getswitchinterval() if seen else 0.0
            later = [t for t in after if type(t) not in MARKERS and t is not PAUSED and t < ran_until]
            paced = (
                len(later) <= self._leads[-1]
                if later and self._leads
                else not later and seen is not None and self._waited(handed, seen)
            )
            # A held step's device time was at most its hand-off to its completion seen, or to the look that found it
            # done (the first step's is no window's: booked as the startup's end, it gives no typical step). Not the
            # loop's time between calls: a host that ran ahead calls far more often than its device completes.
            self._bounds.append((looked if seen is None else seen) - handed[-1])
            self._leads.append(len(later))
            # A Given's hold whose arrays were all deleted says nothing of its step (bounded by the next hold).
            failed = {
                i
                for i, hold, end in zip(taken.held, taken.holds, ends, strict=True)
                if end is None and type(hold) is Hold
            }
            ends_at = self._ends(taken) | dict.fromkeys(failed)
            ends_at[len(handed) - 1] = None if len(handed) - 1 in failed else seen or looked
            mark = newest if type(newest) is Hold else None
            lead = later[: min(self._leads)]
            done, observed = self._dated(handed, ends_at, lead, mark and mark.marked, seen, paced, self._paused(taken))
            self._read_and_book(taken, done, observed, mark)
        return (len(handed), (handed[-1] - handed[0]) / (len(handed) - 1)) if len(handed) > 1 else None

    @staticmethod
    def _found(after: list[Any], newest: Hold | Given) -> float | None:
        """When the items handed since a look's newest hold say it was complete: a Done (pause() found the last step
        complete), or a Found of it or of a hold handed after it (step() found that complete: the device runs them
        in order). None: they do not."""
        since = {id(newest)}
        for item in after:
            kind = type(item)
            if kind is Hold or (kind is Given and item.arrays):
                since.add(id(item))
            elif kind is Done or (kind is Found and id(item.hold) in since):
                return float(item.at)
        return None

    @staticmethod
    def _ends(taken: Taken) -> dict[int, float | None]:
        """The segments' ends where the host paused: by the next step's hand-off, or by a Done's time."""
        ends: dict[int, float | None] = {p - 1: taken.handed[p] for p in taken.pauses}
        for index, at in taken.marks.items():
            ends[index] = min(at, ends.get(index) or at)
        return ends

    @staticmethod
    def _paused(taken: Taken) -> set[int]:
        """The segments (their last steps' indexes) that end where the host paused, unmarked: by the next step's
        hand-off only."""
        return {p - 1 for p in taken.pauses} - taken.marks.keys()

    def _kept_up(self, handed: list[float], busy: float) -> bool:
        """Whether a device could have kept up with the host that handed these steps: a typical step no longer than
        the stall threshold's count of the host's typical spacing (a host that ran ahead, as Keras through an epoch,
        hands its steps many times faster than its device completes them)."""
        spacing = self._spacing(handed)
        return spacing is not None and busy <= self._stall_factor * spacing

    @classmethod
    def _waited(cls, handed: list[float], seen: float) -> bool:
        """Whether a host with no lead waited for its device: the time it spent between its calls, beyond the newest
        step's device time (its hand-off to its completion seen), is within the GIL's switch interval."""
        spacing = cls._spacing(handed)
        return spacing is not None and spacing - (seen - handed[-1]) <= sys.getswitchinterval()

    @staticmethod
    def _spacing(handed: list[float]) -> float | None:
        """The host's typical time between its calls (the upper median), None for fewer than two."""
        spacing = sorted(b - a for a, b in itertools.pairwise(handed))
        return spacing[len(spacing) // 2] if spacing else None

    def _dated(
        self, handed: list[float], ends_at: dict[int, float | None], later: list[float], marked: float | None,
        seen: float | None, paced: bool, paused: set[int],
    ) -> tuple[list[float | None], list[bool]]:  # fmt: skip
        """The steps' completions, segment by segment (each ends at a key of `ends_at`, by its value; None: unready),
        and which were observed (`seen`, the newest's; or a paced host's calls). A segment that ends where the host
        paused (`paused`, no mark) ends by the next hand-off only, far later: where its device could have kept up
        with its host, its steps are bounded by the host's calls at the most lead the recent looks saw (a queue
        fitted to that end, or a typical step of a busier minute, would pile them up into the pause)."""
        done: list[float | None] = []
        observed: list[bool] = []
        start = self._last_done()
        busy = self._typical() or min(self._bounds, default=0.0)
        ran = seen is not None
        first = 0
        for last in sorted(ends_at):
            if (count := last - first + 1) <= 0:
                continue
            if (end := ends_at[last]) is None:
                done += [None] * count
                observed += [False] * count
                self._problem("unready", "a step's ready array was deleted or donated", times=count)
            else:
                segment, newest = handed[first : last + 1], ran and last == len(handed) - 1
                begin = segment[0] if start is None else start
                lead = max(self._leads) if last in paused and self._leads and self._kept_up(segment, busy) else None
                dates = apportion(begin, max(end, begin), segment, later if newest else [], newest, paced, busy,
                                  marked if last == len(handed) - 1 else None, lead)  # fmt: skip
                done += dates
                observed += [dates.paced] * (count - 1) + [newest]
                start = dates[-1]
            first = last + 1
        return done, observed

    def _book_unheld(self, size: int, paused: bool = False) -> None:
        """Book the first `size` items' steps, none held: each segment ends by the next one's first hand-off, the last
        by now. A loop that paused: where its device would still be running them at the stall threshold's pace (it
        ran ahead of its device), first wait until then, or until the loop calls again: a pause() marks when it
        stopped (a host that waited for its device, as Keras at an epoch's end, is seen waiting), a step does not
        (they are booked by when the loop was found still). The stall threshold of the typical step, or before one is
        known of the least bound a held step gave. Where the loop did not call again, a barrier on every device says
        when its device was done with them: seen complete then where it was still running them (a loaded machine's
        device may run far slower than that pace). Not seen so and with no mark, the last segment ends where the host
        paused, as an unnamed PAUSED does (`_dated`: its host's calls bound it where its device kept up)."""
        by = math.inf
        drained: tuple[float, bool] | None = None
        if paused:
            self._hand.let_go()
            self.every = LOOK  # a loop that resumes is looked at often, until it steps on
            start = self._last_done()
            pace = self._stall_factor * (self._typical() or min(self._bounds, default=0.0))
            wait = 0.0
            if start is not None and pace:
                end = start
                for item in list(self._handed)[:size]:
                    if type(item) not in MARKERS and item is not PAUSED:
                        end = max(item, end) + pace
                wait = end - self._clock()
            if wait > 0:
                still = self._clock()
                self._wake.clear()
                if self._wake.wait(wait):
                    if any(type(item) is Done or (type(item) is Hold and item.marked is not None)
                           for item in itertools.islice(self._handed, size, None)):  # fmt: skip
                        return  # a pause() marked them: the next look takes them with its hold
                    by = still  # a step came: done by when the loop was found still, as far as anything says
                if self._worker.stopping:
                    return  # the drain books them
            if by == math.inf and start is not None:
                drained = self._drained()
        with quiet():
            taken = self._parse([self._handed.popleft() for _ in range(size)])
            if taken.handed:
                self.looks += 1
                ends_at = self._ends(taken)
                last = len(taken.handed) - 1
                marked = ends_at.get(last)
                end = min(self._clock(), by, marked or math.inf)
                seen = None
                if drained is not None:
                    end = min(end, drained[0])
                    if drained[1] and marked is None:
                        seen = end = drained[0]
                ends_at[last] = end
                paused_at = self._paused(taken)
                if marked is None and seen is None:
                    paused_at.add(last)  # the loop went still unnamed: its last segment ends by when it was found so
                done, observed = self._dated(taken.handed, ends_at, [], None, seen, False, paused_at)
                self._read_and_book(taken, done, observed, None)

    def _drained(self) -> tuple[float, bool] | None:
        """A barrier on every device, dispatched now and waited for: when the work handed before it was done, and
        whether the device was still running it: the barrier not done LOOK after it was sent (an idle device's time
        for a tiny program many times over, and more than a loaded machine's usual delay of a CPU device's thread;
        not the wait's own time, which a late wake of this thread lengthens). Done sooner, the steps were done by
        then (an upper bound). None where the barrier failed."""
        try:
            barrier = self.ops.barrier()
            sent = time.monotonic()
            while not self.ops.ready(barrier):
                if time.monotonic() - sent >= LOOK:
                    self._wait_until(barrier, None)
                    return self._clock(), True
                time.sleep(sys.getswitchinterval())
            return self._clock(), False
        except Exception:
            return None

    def _drain(self, deadline: float) -> None:
        """Book every step handed, waiting for their holds until `deadline` (stop(), flush())."""
        while count := self._held(len(self._handed)):
            self._take(count, deadline)
        if size := len(self._handed):
            self._book_unheld(size)
        self._flush_loss()

    def _wait(self, holds: list[Hold | Given], deadline: float | None) -> list[float | None]:
        """Wait for the holds in one call (one release of the GIL): when each was known done, None where one was
        deleted or donated (then each on its own: a step is done when what is left of its hold is)."""
        arrays = [handles(hold) for hold in holds]
        if all(arrays) and not any(type(hold) is Hold and hold.lost for hold in holds):
            with contextlib.suppress(Exception):
                self._wait_until([h for held in arrays for h in held], deadline)
                return [self._clock()] * len(holds)
        out: list[float | None] = []
        for hold, held in zip(holds, arrays, strict=True):
            try:
                alive = [h for h in held if not self.ops.deleted(h)]
                if not alive or (type(hold) is Hold and hold.lost):
                    raise ValueError("deleted or donated")
                self._wait_until(alive, deadline)
                out.append(self._clock())
            except Exception:
                out.append(None)
        return out

    def _wait_until(self, arrays: list[Any], deadline: float | None) -> None:
        """ops.wait(arrays), or, before a deadline (stop()), polling until then."""
        while deadline is not None and not self.ops.ready(arrays):
            if time.monotonic() >= deadline:
                raise TimeoutError("not done when jaxmon stopped")
            time.sleep(0.001)
        self.ops.wait(arrays)

    def _parse(self, items: list[Any]) -> Taken:
        """The steps among `items` as columns, each given what the Given handed before it says."""
        given, offset = self._given, self._offset
        types = list(map(type, items))
        self._kept = 0
        self.holds += types.count(Hold)
        if len(items) > 1 and types.count(float) == len(items) - 1 and types[-1] is Hold:  # common: floats, its hold
            self._offset = offset + len(items) - 1
            return Taken(items[:-1], [0], [given], [offset], [len(items) - 2], [items[-1]], [], {}, [])
        taken = Taken([], [], [], [], [], [], [], {}, [])
        handed = taken.handed
        held: Given | None = None  # a Given with arrays: the hold of the step after it
        for item, kind in zip(items, types, strict=True):
            if kind is Given:
                given, offset, held = item, 0, item if item.arrays else None
                if held is not None:  # itself and its clones (of JAX numbers) until a look takes it
                    self._kept = max(self._kept, 1 + sum(type(v) not in HOST for v in item[:4]))
            elif kind is Hold or item is PAUSED:
                if handed and kind is Hold:
                    taken.held.append(len(handed) - 1)
                    taken.holds.append(item)
                elif handed:
                    taken.pauses.append(len(handed))
                elif kind is Hold:
                    taken.orphans.append(item)
            elif kind is Found:
                pass  # (read by _take for the hold it waited for: no mark of the steps before it)
            elif kind is Done:
                if handed:  # (one first says the newest step of the look before was done by then: _take reads it)
                    taken.marks[len(handed) - 1] = item.at
            else:  # a step: its hand-off time
                if not taken.givens or taken.givens[-1] is not given:
                    taken.starts.append(len(handed))
                    taken.givens.append(given)
                    taken.offsets.append(offset)
                handed.append(item)
                offset += 1
                if held is not None:
                    taken.held.append(len(handed) - 1)
                    taken.holds.append(held)
                    held = None
        self._given, self._offset = given, offset
        return taken

    def _read_and_book(self, taken: Taken, done: list[float | None], observed: list[bool], newest: Hold | None) -> None:
        """The steps' numbers and figures read and checked, and handed to the tracker as runs: consecutive steps
        numbered on, with the same figures and tracked calls, all completed at a known time or all unready. The loss
        gauge read from the newest hold that names some."""
        handed = taken.handed
        runs: list[Run] = []
        key: tuple[Any, ...] | None = None  # the run under way: (figures, calls, unready), its first number and step
        first = start = 0
        for k, (begin, given, offset) in enumerate(zip(taken.starts, taken.givens, taken.offsets, strict=True)):
            stop = taken.starts[k + 1] if k + 1 < len(taken.starts) else len(handed)
            number, *figures = self._read(given, stop - begin)
            base = None if number is None else number + offset - begin  # step i's number: base + i
            for i in range(begin, stop):
                this = None if base is None else (*figures, given.calls, done[i] is None)
                if this != key or (base is not None and base + i != first + i - start):
                    if key is not None:
                        runs.append(self._slice(taken, done, observed, first, start, i, key))
                    key, first, start = this, (base or 0) + i, i
        if key is not None:
            runs.append(self._slice(taken, done, observed, first, start, len(handed), key))
        if newest is not None and newest.loss:
            last = next((r for r in reversed(runs) if r.done is not None), None)
            self._loss = (newest, last.first + len(last.handed) - 1 if last is not None else None)
        self._book(runs, *self._read_loss(still=newest is None))
        self.booked += len(handed)

    @staticmethod
    def _slice(
        taken: Taken, done: list[float | None], seen: list[bool], first: int, start: int, stop: int, key: Any
    ) -> Run:
        """Steps `start` to `stop` of a look as a run from number `first` (`key`: its figures, calls, unready)."""
        examples, tokens, flops, calls, unready = key
        dates = None if unready else done[start:stop]
        return Run(first, taken.handed[start:stop], dates, seen[start:stop], examples, tokens, flops, calls)  # type: ignore[arg-type]

    def _flush_loss(self) -> None:
        """The loop is still: the newest loss held is read now."""
        loss, of = self._read_loss(still=True)
        if loss is not None:
            self._book([], loss, of)

    def _read_loss(self, still: bool) -> tuple[dict[str, float] | None, tuple[int | None, int]]:
        """The scalars of the newest hold naming loss scalars, and (its step, its dict's names not held): read at
        most once per LOOK_MAX (a look's longest spacing) while the loop steps, and once it is `still`."""
        now = self._clock()
        if self._loss is None or not (still or now - self._loss_read >= LOOK_MAX):
            return None, (None, 0)
        (hold, number), self._loss, self._loss_read = self._loss, None, now
        try:
            return {name: float(self.ops.value(h)) for name, h in zip(hold.loss, hold.handles, strict=False)}, (
                number, hold.left_out,
            )  # fmt: skip
        except Exception:  # deleted or donated since (counted with its step)
            return None, (None, 0)

    def _read(self, given: Given, steps: int) -> tuple[int | None, Any, Any, Any]:
        """A Given's number and figures, read and checked: one that is not an integer (the number) or a finite number
        >= 0 (a figure) is dropped for its `steps` steps and counted as `invalid`, an array deleted before it was
        read as `unread`; each logged once per field and kind."""
        out: list[Any] = []
        for name, value in zip(FIELDS, given[:4], strict=True):
            if value is LOST or self.ops.is_array(value):
                try:
                    if value is LOST:
                        raise ValueError("deleted or donated before step() was called")
                    value = self.ops.value(value)
                except Exception as exc:
                    event = "an array given to step() was deleted or donated before it was read"
                    self._count("unread", name, steps, event, detail=str(exc)[:200])
                    out.append(None)
                    continue
            checked = integer(value) if name == "step" else figure(value)
            if checked is None and (value is not None or name == "step"):
                expected = "an integer" if name == "step" else "a finite number >= 0"
                event = "a number given to step() is not usable: dropped for this step"
                self._count("invalid", name, steps, event, given=shown(value), expected=expected)
            out.append(checked)
        if out[0] is not None and type(given.number) is not int:
            self._hand.device_step = out[0]
        return out[0], out[1], out[2], out[3]

    def _count(self, reason: str, field: str, steps: int, event: str, **fields: Any) -> None:
        self._problem(reason, event, key=f"{reason}.{field}", times=steps, field=field, **fields)


def figure(value: Any) -> float | None:
    """`value` as a finite float >= 0: a Python, NumPy (or read JAX) real scalar; None for anything else."""
    if value is not None and usable(value):
        return float(value)
    if isinstance(value, bool) or not (isinstance(value, int | float) or _scalar(value, "iuf")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def integer(value: Any) -> int | None:
    """`value` as a step number: a Python, NumPy (or read JAX) integer; a float, even 3.0, or a bool is not one."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not (isinstance(value, int) or _scalar(value, "iu")):
        return None
    return int(value)


def _scalar(value: Any, kinds: str) -> bool:
    """Whether `value` is a NumPy scalar or 0-d array of one of the dtype `kinds` (as a JAX scalar reads)."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return getattr(value, "shape", None) == () and isinstance(kind, str) and len(kind) == 1 and kind in kinds
