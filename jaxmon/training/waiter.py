"""jaxmon's waiter thread: it takes the steps `step()` handed, waits for them, dates them and hands them back to the
tracker to book (docs/training.md, "How a step is measured").

The waiter looks at the handed steps at most once per LOOK while steps come. A step is handed with no handle at all
(taking one costs microseconds on the training thread, dropping it as many here), except the one the waiter asks
for: at each look it sets `want`, and the next `step()` takes jaxmon's own handles on its ready arrays (a `Hold`)
and wakes it. The waiter takes every step handed up to that one and waits for its hold in one call: one device runs
its programs in dispatch order, so the steps before it completed before it. The looked-at step was usually still
running (the host dispatches ahead of the device): the call returns at its completion. The earlier ones completed
while the waiter was not looking; their completions are not observed. A loop paced by its device (it waits for the
step before last, or for each step) calls `step()` right after each completion, `lag` steps ahead (lag: the steps
it handed while the waiter waited for the newest): so step k is dated at the host's `step()` call for step
k + lag + 1, kept within the batch's interval and in order. A loop further ahead of its device has no such rhythm: the
interval is shared evenly. Pure arithmetic, tested on literals (dating.py).

step() also holds a step's arrays once per look's time of the host's, so that a loop that pauses or ends leaves at
most that much of its steps un-held (_take_paused dates them); a badput() block's mark dates them exactly.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Callable

import jaxmon.training.steps as steps
from jaxmon.threads import Worker
from jaxmon.training.dating import apportion, chain
from jaxmon.training.handed import TrainingOps
from jaxmon.training.steps import MARK, RESUMED, Base, Handoff, Hold, Item, Run, at, expand, held

LOOK = 0.02  # the most often the waiter looks while steps come (seconds): a wake, a hold, a wait a look
# Where steps come SHORT apart or less (the real clock) for STEADY looks, a look waits for about LOOK_STEPS steps, up
# to LOOK_MAX (seconds): its fixed cost (a wake, a hold, a wait that releases and takes back the GIL, the batch's
# shared booking: 500-800 µs of CPU where the loop and XLA keep the cores busy) is shared by thousands of steps of
# 0.3 ms rather than 20 (the waiter's CPU a step: 7 µs at 100, 2.2 at 350, 0.8 at 2000). Only a batch of follow-on
# steps (steps.py) makes no object the cyclic GC tracks a step: after a look at any other, the next one waits for at
# most half the collector's young threshold (350 steps by default; Waiter._tuple_steps). Longer steps: a look every
# LOOK, so that a look sees a host pause as it happens.
LOOK_STEPS = 2000
LOOK_MAX = 0.5
SHORT = 0.0025
# (about 0.1 s of steps: a run of a few tens of steps, a test's or an eval's, keeps a look every LOOK)
STEADY = 5
# The host's lead is taken as the least of this many looks' (apportion's `later`).
LEADS = 8
# A wait that returned sooner than this (seconds) waited for nothing: its newest step was complete already.
BLOCKED = 0.0002
# While no step comes, the waiter looks again after this long anyway (its stop wakes it at once).
IDLE_WAIT = 1.0
# Steps handed but no looked-at step after this long (and this many of the loop's recent step intervals): the loop
# paused, the waiter dates the steps so far (_take_paused).
STILL = LOOK
STILL_STEPS = 4
# Within a long look, a step() this long (seconds) after the one before hands a RESUMED marker: the loop paused. A
# loop that waits for its steps calls step() this late after a long device step too, which the marker would date as
# the host's pause: 40 ms keeps the loop's ordinary long steps (and a loaded machine's) on the host's rhythm.
PAUSE = 2 * LOOK
# A first looked-at step longer than this from hand-off to done is taken for a first run's one-time work, not a step.
FIRST_BUSY_MAX = 0.25


class Waiter:
    """The thread that sees the handed steps complete. `handed` is the tracker's deque (step() appends, this takes);
    `last_done()` the last completion booked; `book(batch, done, hold)` books a batch under the tracker's lock;
    `problem(reason, event, ...)` counts and logs; `typical()` a step's typical device time, `pace()` the window's
    mean step (the accounting's); `pending` the tracker's max_pending."""

    def __init__(
        self,
        handed: deque[Item],
        ops: TrainingOps,
        clock: Callable[[], float],
        problem: Callable[..., None],
        last_done: Callable[[], float | None],
        book: Callable[[list[Handoff] | Run, list[float | None], Hold | None], None],
        typical: Callable[[], float | None] = lambda: None,
        pace: Callable[[], float | None] = lambda: None,
        pending: int = 8192,
    ) -> None:
        self._handed = handed
        self.ops = ops
        self._clock = clock
        self._problem = problem
        self._last_done = last_done
        self._book = book
        self._typical = typical
        self._pace = pace
        # A look's steps stay well within max_pending; after a batch of Handoff tuples (alive until the look), under
        # half the collector's young threshold: past it they would make it collect (test_step_gc.py).
        young = gc.get_threshold()[0] // 2 or LOOK_STEPS
        cap = max(min(LOOK_STEPS, pending // 4), 1)
        self._run_steps, self._tuple_steps = cap, max(min(cap, young), 1)
        self._base: Base | None = None  # the last step taken, that a follow-on step handed after it takes on
        # The host's lead at the last looks; none known at first: dated as a loop waiting for each step.
        self._leads: deque[int] = deque([0], maxlen=LEADS)
        # Whether the newest step still ran at the last looks; at first: a device that keeps up.
        self._ran: deque[bool] = deque([False], maxlen=LEADS)
        self.want = True  # the next step() takes a hold and wakes the waiter (read by step(): one attribute)
        self.looks = 0  # batches taken
        self.taken = 0  # steps taken and not booked yet
        self._spacing = 0.0  # the loop's recent time between two step() calls
        self._hurry = False  # take the handed steps without waiting for the next look
        self._first_busy = 0.0  # the first looked-at step seen running: from its hand-off to its completion
        self._handoff = threading.Event()
        self._last_look = -float("inf")  # when the handed steps were last taken
        self._paced = -float("inf")  # the same, on the real monotonic clock (the looks' pace)
        # The time between two looks while steps come (read by step(), which also holds a step that often): LOOK, or
        # LOOK_STEPS of the loop's recent steps where they are short, within [LOOK, LOOK_MAX].
        self.every = LOOK
        self._short = 0  # the looks in a row whose steps came SHORT apart or less
        self._steady = True  # no look since the last one's dated a paused loop's steps (_take_paused)
        # No step() for this long (the tracker's clock): the loop paused (or ended). STILL, or STILL_STEPS of its steps.
        self.still = STILL
        # A step() this long after the one before says that the loop paused (step() hands a RESUMED marker first):
        # `still`, at least PAUSE, while looks are longer than LOOK (a pause within one is not seen by looking).
        self.resumed_after = float("inf")
        self._worker = Worker("training", self._wait_loop, self._handoff.set)
        self.thread = self._worker.start().thread

    def wake(self) -> None:
        """A looked-at step (or a mark) was handed."""
        self._handoff.set()

    def look_now(self) -> None:
        """Look at the next step handed as it comes (the training thread: a sampled trace's last step is next)."""
        self.want = True
        self.hurry()

    def hurry(self) -> None:
        """The host stops stepping for a while (a badput() block opens, its mark handed): take the steps now."""
        self._hurry = True
        self._handoff.set()

    def stop(self, timeout: float) -> None:
        """End after the steps it waits for (a hung device keeps it: a daemon thread)."""
        self._worker.stop(timeout)

    def _wait_loop(self) -> None:
        while not self._worker.stopping:
            try:
                self._look()
            except Exception as exc:  # a bug here must not end the telemetry (nor reach training)
                self._problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")

    def _held(self) -> int:
        """How many handed steps to take: up to the last one with a hold (0: none has one)."""
        handed = self._handed
        for back in range(1, len(handed) + 1):
            if held(handed[-back]):
                return len(handed) - back + 1
        return 0

    def _look(self) -> None:
        """Take the steps handed up to the newest looked-at one (at most one look per LOOK while steps come), wait
        for it, and book them."""
        # At most one look per LOOK while steps come: only hurry() (a badput() block opens: it sets the flag first)
        # and stop() end the wait early, not a step's wake.
        while not self._hurry and (wait := self._paced + self.every - time.monotonic()) > 0:  # real time, not a test's
            self._handoff.clear()
            self._handoff.wait(wait)
            if self._worker.stopping:
                return
        self._hurry = False
        self._handoff.clear()
        # Ask for a fresh looked-at step (the next step() holds its arrays and wakes the waiter): it usually still
        # runs when the waiter waits for it, so its completion is seen, not estimated. A step held meanwhile (one
        # per LOOK of the host's time) only dates the steps so far when no step comes (the loop paused or ended).
        self.want = True
        newest = self._handed[-1] if self._handed else None
        if newest is None:
            self._handoff.wait(IDLE_WAIT)
        elif not held(newest) and (age := self._clock() - at(newest)) < self.still:  # a step may come yet (the
            self._handoff.wait(self.still - max(age, 0.0))  # host's clock)
        if self._worker.stopping:
            return
        count = self._held()
        if not count:
            if newest is not None and self._handed and self._handed[-1] is newest:
                self._take_paused()  # no step came meanwhile: the loop paused (or ended)
            return
        self.want = False  # taken: the next look asks again
        paced, self._last_look, self._paced = self._paced, self._clock(), time.monotonic()
        self.looks += 1
        popleft = self._handed.popleft
        items = [popleft() for _ in range(count)]
        base = self._base
        run = Run.of(items, base)  # the common batch, as columns; else each step's tuple
        if run is not None:
            self._base = run.last()
            plain = True
        else:
            batch, self._base = expand(items, base)
            plain = set(map(type, map(steps.NUMBER, batch))) == steps.INT  # no marker (nor a number to read)
            if 3 * (resumed := sum(item[1] is RESUMED for item in batch)) >= count:  # a pause before most of its
                self._short, self.every = 0, LOOK  # steps: the loop's steps are long now, each looked at
        # The loop's recent step on the real clock: the time since the last look, shared; not where the loop paused
        # in it (a marker in the batch, or a look that dated a paused loop's steps: _take_paused).
        if paced > -float("inf") and self._steady and plain:
            spacing = (self._paced - paced) / count
            self._short = self._short + 1 if spacing < SHORT else 0
            long = self._short >= STEADY  # a loop of short steps for a while, not a start's few
            # At most twice as long as the last look: one estimate off by a pause costs a look, not a batch of
            # thousands of steps (over the collector's young threshold, towards max_pending).
            # A look of follow-on steps is as long again: the next is likely one too.
            cap = self._run_steps if run is not None else self._tuple_steps
            self.every = min(LOOK_MAX, max(LOOK, cap * spacing), 2 * self.every) if long else LOOK
        self._steady = True
        self.resumed_after = max(self.still, PAUSE) if self.every > LOOK else float("inf")
        self.taken = count
        try:
            hold = items[-1][6]  # type: ignore[index]  # the last one taken is held: a Handoff
            if run is not None:
                dates = self._dates(run.handed, run.holds, hold)
                if dates is not None:
                    self._book(run, dates, hold)
                    return
                batch, _ = expand(items, base)  # a hold's array deleted or donated: each looked-at step on its own
                self._book(batch, self._one_by_one(batch, hold), hold)
                return
            if not plain:
                batch = [item for item in batch if item[1] is not MARK]  # a mark is no step: its hold dated those
                if resumed:  # before it
                    batch = self._before_pauses(batch)
            marked = items[-1][0] if items[-1][1] is MARK else None  # type: ignore[index]  # (a Handoff: held)
            times, holds = list(map(steps.HANDED, batch)), list(filter(None, map(steps.HOLD, batch)))
            dates = self._dates(times, holds, hold, marked)
            self._book(batch, self._one_by_one(batch, hold) if dates is None else dates, hold)
        finally:
            self.taken = 0

    def _take_paused(self) -> None:
        """No step came to be looked at: date the steps handed since the last looked-at one (at most a look's time of
        the host's: step() holds one that often), with no device call (a barrier would not do: XLA:CPU runs a
        program that reads none of their outputs beside them). They complete in order after the last completion
        booked: each a typical step's device time (the window's median busy part) after the one before it, or after
        its hand-off if later. Where that puts the last one after now (a host that ran ahead, then stopped: its
        steps still run), the waiter waits until then first; a step handed meanwhile bounds them instead."""
        start = self._last_done()
        busy = self._typical() or self._first_busy  # before a window: the first looked-at step's hand-off to done
        tail = [at(item) for item in list(self._handed) if type(item) is not tuple or item[1] is not RESUMED]
        # The host handed them well before the last completion, or faster than the device runs steps: it ran ahead,
        # and they may run a while yet (a loop's epoch end may mark them: jaxmon.keras does).
        ahead = (
            start is not None
            and bool(tail)
            and (tail[0] < start - (busy or LOOK) or (busy > 0 and tail[-1] - tail[0] < (len(tail) - 1) * busy / 2))
        )
        if ahead and start is not None:
            rate = max(busy, self._pace() or 0.0)  # the wait at the device's pace (a burst's dated busy parts are ~0)
            end = start
            for handed in tail:
                end = max(handed, end) + rate
            # They may run longer than a typical step each (a loop's epoch end may mark them meanwhile): twice the
            # estimate, at least STILL after the newest was handed; a loop that waited for each of them (its first
            # completion seen late: the GIL) has its next step by then, or is dated by the estimate.
            end = max(end + (end - start), tail[-1] + STILL)
            if (wait := end - self._clock()) > 0:
                self._handoff.wait(min(wait, IDLE_WAIT))
                if self._held() or self._worker.stopping or wait > IDLE_WAIT:
                    return  # a step came (the next look takes these with it), or look again
        items = [self._handed.popleft() for _ in range(len(self._handed))]
        base = self._base
        run = Run.of(items, base)  # as columns where they follow on: no tuple a step
        batch: list[Handoff] | Run
        if run is not None:
            batch, times, self._base = run, run.handed, run.last()
        else:
            taken, self._base = expand(items, base)
            batch = [item for item in taken if item[1] is not RESUMED]
            times = list(map(steps.HANDED, batch))
        self.taken = len(times)
        self.looks += 1
        now = self._last_look = self._clock()
        self._paced, self._steady = time.monotonic(), False
        try:
            dates: list[float | None]
            if ahead and start is not None and busy <= 0:  # no typical step known yet: the time since the last
                dates = [start + (now - start) * (i + 1) / len(times) for i in range(len(times))]  # completion, shared
            else:
                dates = [*chain(times, start, busy, now)]
            if times:
                self._book(batch, dates, None)
        finally:
            self.taken = 0

    def _before_pauses(self, batch: list[Handoff]) -> list[Handoff]:
        """Book the steps of `batch` handed before its last RESUMED marker (the loop paused, then stepped again):
        each segment before a marker is dated as the steps of a loop that paused (`_paused_dates`: no later than the
        resuming call), not by the host's calls after the pause. Returns the steps after the last marker."""
        segment: list[Handoff] = []
        for item in batch:
            if item[1] is not RESUMED:
                segment.append(item)
                continue
            if segment:  # its holds (done before the look) waited for: a deleted or donated ready array is counted
                holds = list(filter(None, map(steps.HOLD, segment)))
                dates = self._one_by_one(segment, None) if holds and not self._waited(holds) else None
                self._book(segment, dates or self._paused_dates(segment, item[0]), None)
            segment = []
        return segment

    def _paused_dates(self, segment: list[Handoff], until: float) -> list[float | None]:
        """The completions of the un-held steps handed before a pause that ended at `until`: the last one a typical
        step's device time after its hand-off (no later than `until`), the ones before it from the host's rhythm up
        to there (apportion), as a batch whose newest completion was seen."""
        start = self._last_done()
        busy = self._typical() or self._first_busy
        handed = [item[0] for item in segment]
        if start is None:
            return [*chain(handed, start, busy, until)]
        end = max(min(max(handed[-1], start) + busy, until), start)
        return list(apportion(start, end, handed, []))

    def _dates(
        self, handed: list[float], holds: list[Hold], hold: Hold | None, marked: float | None = None
    ) -> list[float | None] | None:
        """When each step of a batch (`handed`: its hand-off times; `holds`: the holds among its steps, `hold` the
        newest's; `marked`: when the host handed the mark that ends it, if one does) completed; None when a hold's
        array was deleted or donated (the caller waits for each on its own).

        One blocking call for the batch's holds: one release of the GIL per look. The
        newest step's completion is when that call returns, if it still ran (the usual case: the host dispatches
        ahead); the earlier ones' are estimated (apportion). Only jaxmon's own handles are waited on or asked, so
        a deletion at any moment makes the call raise, never crash."""
        if not handed:
            return []
        if len(handed) > 1:
            self._spacing = (handed[-1] - handed[0]) / (len(handed) - 1)
            self.still = max(STILL, STILL_STEPS * self._spacing)
        if hold is not None and (not holds or holds[-1] is not hold):
            holds = [*holds, hold]  # a mark's
        looked = self._clock()
        if not self._waited(holds):
            return None
        newest = self._clock()
        ran = newest - looked >= BLOCKED
        later = [t for t in map(at, list(self._handed)) if t < newest]  # handed while the newest ran: the host's lead
        # A call that came just after the newest completed, before this thread had the GIL back, reads as lead:
        # the least lead of the last looks is the loop's (a loop's lead is steady).
        self._leads.append(len(later))
        later = later[: min(self._leads)]
        start = self._last_done()
        if start is None:  # the first steps: no completion known before them, and no look before
            start, later, ran = handed[0], [], True
        self._ran.append(ran)
        paced = 2 * sum(self._ran) > len(self._ran)  # the device behind the host at most recent looks
        busy = 0.0
        if not ran:  # done before the look: dated by a typical step's device time (the batch's share, at first)
            busy = self._typical() or (newest - start) / len(handed)
        completions: list[float | None] = list(apportion(start, newest, handed, later, ran, paced, busy, marked))
        if not self._first_busy and ran and 0 < newest - handed[-1] < FIRST_BUSY_MAX:
            self._first_busy = newest - handed[-1]
        return completions

    def _waited(self, holds: list[Hold]) -> bool:
        """Wait for the holds' arrays in one call (one release of the GIL); False when one was deleted or donated
        (before step() held it, or since: only jaxmon's own handles are asked, so the call raises, never crashes)."""
        try:
            if any(h.lost or not h.handles for h in holds):
                return False
            self.ops.wait([handle for h in holds for handle in h.handles])
        except Exception:
            return False
        return True

    def _one_by_one(self, batch: list[Handoff], hold: Hold | None) -> list[float | None]:
        """`batch`'s completions when one of its holds failed: each looked-at step waited for on its own, the steps
        before it (back to the previous looked-at one) spread evenly up to its completion. A looked-at step whose
        ready array was deleted or donated says nothing of when it and the steps before it completed: they are
        counted unready, and their time is booked whole with the next known completion (a gap). The steps not
        looked at were never asked (their arrays are not jaxmon's)."""
        out: list[float | None] = []
        start = self._last_done()
        segment: list[Handoff] = []
        for i, item in enumerate(batch):
            segment.append(item)
            mine = item[6] if item[6] is not None else hold if i == len(batch) - 1 else None
            if mine is None:
                continue
            when, detail = None, "deleted or donated before step() was called"
            if not (mine.lost or not mine.handles):
                try:
                    self.ops.wait(mine.handles)
                    when = self._clock()
                except Exception as exc:
                    detail = str(exc)[:200]
            if when is None:
                self._problem("unready", "a step's ready array was deleted or donated", times=len(segment),
                              detail=detail)  # fmt: skip
                out += [None] * len(segment)
            else:
                base = start if start is not None else segment[0][0]
                out += [base + (when - base) * (k + 1) / len(segment) for k in range(len(segment))]
                start = when
            segment = []
        return out + [None] * len(segment)
