"""jaxmon's waiter thread: it takes the steps `step()` handed, waits for the ones held, dates and books them.

The protocol with the training thread is in hand.py. A look:
1. At most one per `every` while steps come: LOOK at first, a LOOK longer each look while the loop steps on, up to
   LOOK_MAX and about LOOK_STEPS of its steps (a look costs a wake, a wait that releases and takes back the GIL and a
   booking, shared by the steps since the last one). `hurry()` (a badput() block opened) and the sampler's
   `look_now()` look at once.
2. It asks for a hold (`asked`): the next step() takes jaxmon's own handles on its arrays and wakes this thread, which
   takes every item handed up to the last hold and waits for the holds in one call. The newest usually still runs
   (the host dispatches ahead of its device): its completion is seen, when the wait returns. step() also holds a
   step once per `every` of the host's time, so that a loop that stops leaves at most that much of its steps
   without one. No step for `still` after the ask: the loop paused or ended; its steps since the last hold are
   taken without one.
3. It cuts the steps into segments where the host paused (PAUSED: the steps before it completed before the step after
   it was handed) and dates each (dating.apportion: the device as a FIFO queue, the host's calls where its device
   paces it), from observations only: the completion seen, the hand-offs, the host's lead (the steps it handed while
   the newest ran), whether it waits for its device (it called again right after a completion seen), and a
   typical step's device time (the median of those observed: the ledger's; before any, the least time from a held
   step's hand-off to the look that found it done). A hold whose array was deleted or donated makes the steps up to
   it unready (counted; their time is booked with the next completion known).
4. It reads the numbers and figures given as arrays, checks every number and figure, and hands the tracker runs of
   steps (ledger.Run) to book. A look's steps are columns (hand-off times, and the contexts they follow on from):
   no object a step, so that a look of thousands makes Python's cyclic GC collect no more than the loop does.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from jaxmon.threads import Worker
from jaxmon.training.dating import apportion
from jaxmon.training.hand import PAUSED, Given, Hand, Held, Hold, shown
from jaxmon.training.handed import TrainingOps
from jaxmon.training.ledger import Run, usable

# The shortest time between two looks while steps come (seconds), and the longest.
LOOK = 0.02
LOOK_MAX = 0.5
# A look waits for about this many of the loop's steps at most: past them a batch costs more than a look.
LOOK_STEPS = 2000
# The host's lead is the least of, and whether it waits for its device the most said by, this many recent looks.
RECENT = 8
# The loss gauge is read at most this often while the loop steps (a copy of a few scalars to the host each time).
LOSS_EVERY = LOOK_MAX
FIELDS = ("step", "examples", "tokens", "model_flops")
# The items handed that are no step (hand.py's protocol; PAUSED too).
MARKERS = (Given, Hold)


class Taken(NamedTuple):
    """A look's steps as columns: their hand-off times; the contexts they follow on from, as (index of the first
    step in it, context, that step's place in the context); the holds (index of the step held, hold); the pauses
    (index of the step handed after one)."""

    handed: list[float]
    spans: list[tuple[int, Given, int]]
    holds: list[tuple[int, Hold]]
    pauses: list[int]


class Waiter:
    """The thread that books the handed steps. `book(runs, loss, (loss_step, left_out))` books them under the
    tracker's lock (with the loss gauge's scalars of step loss_step, where read, and how many names were not held);
    `typical()` is a step's typical observed device time, `last_done()` the last completion booked (the ledger's);
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
    ) -> None:
        self._hand = hand
        self._handed = handed
        self.ops = ops
        self._clock = clock
        self._book = book
        self._problem = problem
        self._typical = typical
        self._last_done = last_done
        self._context = Given(None, None, None, None, ())  # what the next step handed is given
        self._offset = 0  # its place in it
        self._leads: deque[int] = deque([0], maxlen=RECENT)
        self._paced: deque[bool] = deque([False], maxlen=RECENT)  # whether the host waited for its device
        self._bounds: deque[float] = deque(maxlen=RECENT)  # a held step's hand-off to the look that found it done
        self._seen: float | None = None  # the last look's completion seen, until the host's next call is known
        self._loss: tuple[Hold, int | None] | None = None  # the newest held step naming loss scalars, not read yet
        self._loss_read = -math.inf
        self.every = LOOK  # the time between two looks while steps come (read by step(): a hold that often)
        self.still = LOOK  # no step() for this long: the loop paused or ended (read by step(): `paused_after`)
        self.looks = 0  # looks that took steps
        self.taken = 0  # steps taken and not booked yet
        self.booked = 0  # steps taken and booked (or dropped): the hand's count less this is what is pending
        self._hurry = False
        self._next_look = -math.inf  # when the next look may come (the real monotonic clock)
        self._deadline = 0.0  # stop()'s: the drain waits for holds until then
        self._wake = threading.Event()
        self._worker = Worker("training", self._run, self._wake.set)
        self.thread = self._worker.thread

    def start(self) -> None:
        """Start the thread (once the hand is armed: its first look asks it for a hold)."""
        self._worker.start()

    def wake(self) -> None:
        """A held step was handed (the training thread)."""
        self._wake.set()

    def hurry(self) -> None:
        """Take the steps now (a badput() block opened, its mark handed)."""
        self._hurry = True
        self._wake.set()

    def look_now(self) -> None:
        """Hold the next step and take it as it comes (the training thread: a sampled trace's last step is next)."""
        self._hand.answered = self  # no ask of the waiter's: the next step() holds and wakes this thread
        self._hurry = True

    def stop(self, timeout: float) -> None:
        """Book what was handed (waiting for its holds `timeout` at most), then end."""
        self._deadline = time.monotonic() + timeout
        self._worker.stop(timeout)

    # -- the look -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._worker.stopping:
            self._guarded(self._look)
        self._guarded(self._drain)

    def _guarded(self, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as exc:  # a bug here must not end the telemetry (nor reach training)
            self._problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")
        finally:
            self.taken = 0

    def _look(self) -> None:
        while not self._hurry and (wait := self._next_look - time.monotonic()) > 0:
            self._wake.clear()
            self._wake.wait(wait)
            if self._worker.stopping:
                return
        self._hurry = False
        self._wake.clear()
        self._hand.asked = object()  # the next step() holds its arrays and wakes this thread
        if not self._wake.wait(self.still):  # no step for `still`: the loop paused or ended
            size = len(self._handed)  # the items looked at: the training thread appends after them
            if not self._held(size):
                if size:
                    self._book_unheld(size, paused=True)
                    return
                self._flush_loss()
                self._wake.wait()  # until a step comes (it is held: asked) or stop
            if self._worker.stopping:
                return
        now = time.monotonic()
        if count := self._held(len(self._handed)):
            spacing = self._take(count)
            if spacing is not None:  # the loop's rhythm: a pause is a step() this much later than its steps come
                self.still = LOOK + spacing
                self.every = min(self.every + LOOK, LOOK_MAX, max(LOOK, LOOK_STEPS * spacing))
                self._hand.paused_after = self.still
        self._next_look = now + self.every

    def _held(self, size: int) -> int:
        """How many of the first `size` items to take: up to the last Hold among them (0: none)."""
        handed = self._handed
        for back in range(size - 1, -1, -1):
            if type(handed[back]) is Hold:
                return back + 1
        return 0

    def _take(self, count: int, deadline: float | None = None) -> float | None:
        """Take `count` items (the last a Hold), wait for their holds, date and book their steps; the loop's
        spacing between them (None: fewer than two)."""
        taken = self._parse([self._handed.popleft() for _ in range(count)])
        handed = taken.handed
        self.taken = len(handed)
        if not handed:
            return None
        self.looks += 1
        newest = taken.holds[-1][1]
        try:
            ran = not self.ops.ready(newest.handles)  # still running: its completion is seen when the wait returns
        except Exception:
            ran = False
        looked = self._clock()
        ends = self._wait(taken.holds, deadline)
        seen = ends[-1] if ran else None
        # The host's calls while the newest ran (its lead: the least of recent looks', since a call just after the
        # completion, before this thread had the GIL back, reads as lead), and whether it waits for its device.
        later = [t for t in list(self._handed) if type(t) not in MARKERS and t is not PAUSED and seen and t < seen]
        self._vote(handed[0])
        if lead := len(later):  # paced by its device if its lead holds; ahead of it, with no pace, if it grows
            self._paced.append(lead <= self._leads[-1])
        elif seen is not None:
            self._seen = seen  # voted at the next look, by how soon the host called again
        else:
            self._bounds.append(looked - handed[-1])
        self._leads.append(lead)
        failed = {i for (i, _), end in zip(taken.holds, ends, strict=True) if end is None}
        ends_at: dict[int, float | None] = {p - 1: handed[p] for p in taken.pauses}
        ends_at |= dict.fromkeys(failed) | {len(handed) - 1: None if len(handed) - 1 in failed else seen or looked}
        done, observed = self._dated(handed, ends_at, later[: min(self._leads)], newest.marked, seen is not None)
        self._read_and_book(taken, done, observed, newest)
        return (handed[-1] - handed[0]) / (len(handed) - 1) if len(handed) > 1 else None

    def _vote(self, first: float) -> None:
        """Whether the host waited for the completion the last look saw: it called step() again (`first`, the next
        hand-off) within the GIL's switch interval of it. A host that waits for its device calls as its steps
        complete: its calls date them (dating.apportion's `paced`)."""
        seen, self._seen = self._seen, None
        if seen is not None:
            self._paced.append(first - seen <= sys.getswitchinterval())

    def _dated(
        self, handed: list[float], ends_at: dict[int, float | None], later: list[float], marked: float | None, ran: bool
    ) -> tuple[list[float | None], list[bool]]:
        """The steps' completions, segment by segment (each ends at a key of `ends_at`: by its value, or unready where
        that is None), and which of them were observed (seen, or a paced host's call)."""
        done: list[float | None] = []
        observed: list[bool] = []
        start = self._last_done()
        busy = self._typical() or min(self._bounds, default=0.0)
        paced = 2 * sum(self._paced) > len(self._paced)
        first = 0
        last_index = len(handed) - 1
        for last in sorted(ends_at):
            count = last - first + 1
            if count <= 0:
                continue
            end = ends_at[last]
            if end is None:
                done += [None] * count
                observed += [False] * count
                self._problem("unready", "a step's ready array was deleted or donated", times=count)
            else:
                segment = handed[first : last + 1]
                begin = segment[0] if start is None else start
                newest = last == last_index
                dates = apportion(
                    begin, max(end, begin), segment, later if newest and ran else [], newest and ran, paced, busy,
                    marked if newest else None,
                )  # fmt: skip
                done += dates
                observed += [dates.paced] * (count - 1) + [newest and ran]
                start = dates[-1]
            first = last + 1
        return done, observed

    def _book_unheld(self, size: int, paused: bool = False) -> None:
        """Book the first `size` items' steps, no hold among them (the loop paused or ended): each segment ends by
        the next one's first hand-off, the last by now. Where a typical step's time puts them after now (a host
        that ran ahead, then stopped: they still run), first wait until then, or until a step comes."""
        if paused:
            self._hand.let_go()  # the loop is still: jaxmon holds nothing of it
            self.every = LOOK  # a loop that resumes is looked at often again, until it steps on
            start, busy = self._last_done(), self._typical()
            if start is not None and busy:
                end = start
                for item in list(self._handed)[:size]:
                    if type(item) not in MARKERS and item is not PAUSED:
                        end = max(item, end) + busy
                if (wait := end - self._clock()) > 0:
                    self._wake.clear()
                    if self._wake.wait(wait) or self._worker.stopping:
                        return  # a step came (the next look takes these with it), or stopping (the drain does)
        taken = self._parse([self._handed.popleft() for _ in range(size)])
        self.taken = len(taken.handed)
        if taken.handed:
            self.looks += 1
            self._vote(taken.handed[0])
            ends_at: dict[int, float | None] = {p - 1: taken.handed[p] for p in taken.pauses}
            ends_at[len(taken.handed) - 1] = self._clock()
            done, observed = self._dated(taken.handed, ends_at, [], None, False)
            self._read_and_book(taken, done, observed, None)

    def _drain(self) -> None:
        """On stop: book every step handed, waiting for their holds until the stop's deadline."""
        while count := self._held(len(self._handed)):
            self._take(count, self._deadline)
        if size := len(self._handed):
            self._book_unheld(size)
        self._flush_loss()

    def _wait(self, holds: list[tuple[int, Hold]], deadline: float | None) -> list[float | None]:
        """Wait for the holds' arrays in one call (one release of the GIL): when each was known done (the last: when
        the call returned), None where one was deleted or donated (then each is waited for on its own)."""
        if all(not hold.lost and hold.handles for _, hold in holds):
            try:
                self._wait_until([h for _, hold in holds for h in hold.handles], deadline)
                return [self._clock()] * len(holds)
            except Exception:
                pass
        out: list[float | None] = []
        for _, hold in holds:  # each on its own: a step is done when what is left of its hold is
            try:
                alive = [h for h in hold.handles if not self.ops.deleted(h)]
                if hold.lost or not alive:
                    raise ValueError("deleted or donated")
                self._wait_until(alive, deadline)
                out.append(self._clock())
            except Exception:
                out.append(None)
        return out

    def _wait_until(self, handles: list[Any], deadline: float | None) -> None:
        """ops.wait(handles), or, with a deadline (stop()), polling until then: what is not done by then is unready."""
        if deadline is None:
            self.ops.wait(handles)
            return
        while not self.ops.ready(handles):
            if time.monotonic() >= deadline:
                raise TimeoutError("not done when jaxmon stopped")
            time.sleep(0.001)

    # -- the handed items ---------------------------------------------------------------------------------

    def _parse(self, items: list[Any]) -> Taken:
        """The steps among `items` as columns (Taken), each step's context the one handed before it."""
        context, offset = self._context, self._offset
        types = list(map(type, items))
        if types.count(float) == len(items) - 1 and types[-1] is Hold:  # the common look: floats, then its hold
            taken = Taken(items[:-1], [(0, context, offset)], [(len(items) - 2, items[-1])], [])
            self._offset = offset + len(items) - 1
            return taken
        taken = Taken([], [], [], [])
        handed, spans = taken.handed, taken.spans
        for item, kind in zip(items, types, strict=True):
            if kind is Given:
                context, offset = item, 0
            elif kind is Hold:
                if handed:
                    taken.holds.append((len(handed) - 1, item))
            elif item is PAUSED:
                if handed:
                    taken.pauses.append(len(handed))
            else:  # a step: its hand-off time
                if not spans or spans[-1][1] is not context:
                    spans.append((len(handed), context, offset))
                handed.append(item)
                offset += 1
        self._context, self._offset = context, offset
        return taken

    def _read_and_book(self, taken: Taken, done: list[float | None], observed: list[bool], newest: Hold | None) -> None:
        """Read the steps' contexts (numbers and figures given as arrays read now that they are done, every one
        checked), and hand their runs to the tracker; the loss gauge read from the newest hold that names one."""
        handed, spans = taken.handed, taken.spans
        runs: list[Run] = []
        bounds = [*(start for start, _, _ in spans[1:]), len(handed)]
        for (start, context, offset), stop in zip(spans, bounds, strict=True):
            number, examples, tokens, model_flops = self._read(context, stop - start)
            if number is None:
                continue  # no number to book them under (counted): their time goes to the next step's
            cut = start  # a run: its steps all completed at a known time, or all unready
            for k in range(start + 1, stop + 1):
                if k == stop or (done[k] is None) != (done[cut] is None):
                    known = done[cut:k] if done[cut] is not None else None
                    first = number + offset + cut - start
                    calls = context.calls
                    run = Run(first, handed[cut:k], known, observed[cut:k], examples, tokens, model_flops, calls)  # type: ignore[arg-type]
                    runs.append(run)
                    cut = k
        if newest is not None and newest.loss:
            last = next((r for r in reversed(runs) if r.done is not None), None)
            self._loss = (newest, last.first + len(last.handed) - 1 if last is not None else None)
        loss, of = self._read_loss(still=newest is None)
        self._book(runs, loss, of)
        self.booked += len(handed)

    def _flush_loss(self) -> None:
        """The loop is still: the newest loss held is read now."""
        loss, of = self._read_loss(still=True)
        if loss is not None:
            self._book([], loss, of)

    def _read_loss(self, still: bool) -> tuple[dict[str, float] | None, tuple[int | None, int]]:
        """The loss gauge's scalars of the newest held step that names some, and (its number, the names of its dict
        not held): read at most once per LOSS_EVERY while the loop steps, and as soon as it is `still`."""
        now = self._clock()
        if self._loss is None or not (still or now - self._loss_read >= LOSS_EVERY):
            return None, (None, 0)
        (hold, number), self._loss, self._loss_read = self._loss, None, now
        try:
            loss = {name: float(self.ops.value(h)) for name, h in zip(hold.loss, hold.handles, strict=False)}
        except Exception:  # deleted or donated since (counted with its step, unready)
            return None, (None, 0)
        return loss, (number, hold.left_out)

    def _read(self, context: Given, steps: int) -> tuple[int | None, Any, Any, Any]:
        """A context's number and figures, read and checked: a number that is not an integer, a figure that is not a
        finite number >= 0, is dropped for its `steps` steps and counted as `invalid`; an array deleted before it
        could be read, as `unread`. Logged once per field and kind."""
        out: list[Any] = []
        for name, value in zip(FIELDS, context[:4], strict=True):
            if type(value) is Held:
                try:
                    if value.handle is None:
                        raise ValueError("deleted or donated before step() was called")
                    value = self.ops.value(value.handle)
                except Exception as exc:
                    self._count("unread", name, steps, "an array given to step() was deleted or donated before it "
                                "was read", detail=str(exc)[:200])  # fmt: skip
                    out.append(None)
                    continue
            checked = integer(value) if name == "step" else figure(value)
            if checked is None and (value is not None or name == "step"):
                expected = "an integer" if name == "step" else "a finite number >= 0"
                event = "a number given to step() is not usable: dropped for this step"
                self._count("invalid", name, steps, event, given=shown(value), expected=expected)
            out.append(checked)
        if out[0] is not None and type(context.number) is Held:
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
