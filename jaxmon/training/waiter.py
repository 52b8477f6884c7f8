"""jaxmon's waiter thread: it takes the steps `step()` handed, waits for them, dates them and hands them back to the
tracker to book (docs/training.md, "How a step is measured").

The waiter looks at the handed steps at most once per LOOK while steps come, and waits for all of them in one call.
The newest was usually still running (the host dispatches ahead of the device): the call returns at its completion.
The earlier ones completed while the waiter was not looking; their completions are not observed. A loop paced by
its device (it waits for the step before last, or for each step) calls `step()` right after each completion, `lag`
steps ahead (lag: the steps it handed while the waiter waited for the newest): so step k is dated at the host's
`step()` call for step k + lag + 1, kept within the batch's interval and in order. A loop that runs further ahead
of its device (its calls come before the batch's interval began) has no such rhythm: the interval is shared evenly.
Pure arithmetic, tested on literals.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

from jaxmon.threads import Worker
from jaxmon.training.handed import TrainingOps
from jaxmon.training.steps import Handoff, Step, read_figures

# The waiter looks at the handed steps at most this often while steps come (seconds): it costs a wake and a
# batched wait per look, not per step. After a pause (no step handed) the next step() wakes it at once.
LOOK = 0.02
# The host's lead is taken as the least of this many looks' (apportion's `later`).
LEADS = 8
# A batched wait that returned sooner than this (seconds) waited for nothing: its newest step was complete already.
BLOCKED = 0.0002
# While no step comes, the waiter looks again after this long anyway (its stop wakes it at once).
IDLE_WAIT = 1.0


class Waiter:
    """The thread that sees the handed steps complete. `handed` is the tracker's deque (step() appends, this takes);
    `last_done()` the last completion booked; `book(batch, numbers, done)` books a batch under the tracker's lock;
    `problem(reason, event, ...)` counts and logs."""

    def __init__(
        self,
        handed: deque[Handoff],
        ops: TrainingOps,
        clock: Callable[[], float],
        problem: Callable[..., None],
        last_done: Callable[[], float | None],
        book: Callable[[list[Step], list[int | None], list[float | None]], None],
    ) -> None:
        self._handed = handed
        self.ops = ops
        self._clock = clock
        self._problem = problem
        self._last_done = last_done
        self._book = book
        # The host's lead at the last looks; none known at first: dated as a loop waiting for each step.
        self._leads: deque[int] = deque([0], maxlen=LEADS)
        # Whether the newest step still ran at the last looks; at first: a device that keeps up.
        self._ran: deque[bool] = deque([False], maxlen=LEADS)
        self.looks = 0  # batches taken
        self.taken = 0  # steps taken and not booked yet
        self.idle = False  # waiting for a hand-off (step() then wakes it)
        self._hurry = False  # take the handed steps without waiting for the next look
        self._handoff = threading.Event()
        self._last_look = -float("inf")  # when the handed steps were last taken
        self._worker = Worker("training", self._wait_loop, self._handoff.set)
        self.thread = self._worker.start().thread

    def wake(self) -> None:
        """A step was handed while the waiter was idle."""
        self._handoff.set()

    def hurry(self) -> None:
        """The host stops stepping for a while (a badput() block opens): take the steps handed so far now."""
        if self._handed:
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

    def _look(self) -> None:
        """Take every step handed since the last look (at most one look per LOOK while steps come), wait for them
        in one call, and book them."""
        if not self._handed:
            self.idle = True
            if not self._handed:  # a step handed before the flag was set is seen here; one after it sets the event
                self._handoff.wait(IDLE_WAIT)
            self.idle = False
            self._handoff.clear()
            return
        # Steps come faster than the waiter looks: it takes them in batches, unless the host stops stepping for a
        # while (a badput() block: hurry()), so that the last step before it is seen complete when it was.
        if not self._hurry and (wait := self._last_look + LOOK - self._clock()) > 0:
            self._handoff.wait(wait)
            self._handoff.clear()
            if self._worker.stopping:
                return
        self._hurry = False
        self._last_look = self._clock()
        self.looks += 1
        batch = [Step.of(self._handed.popleft()) for _ in range(len(self._handed))]
        self.taken = len(batch)
        done = self._wait_batch(batch)
        numbers = [self._read(item) for item in batch]
        try:
            self._book(batch, numbers, done)
        finally:
            for item in batch:
                item.drop_arrays()  # hold no array longer than needed
            self.taken = 0

    def _wait_batch(self, batch: list[Step]) -> list[float | None]:
        """When each step of `batch` completed (None: unknown, a ready array was deleted or donated first).

        One blocking call for every ready and figure array of the batch: one release of the GIL per look. The
        newest step's completion is when that call returns, if it still ran (the usual case: the host dispatches
        ahead); the earlier ones' are estimated (apportion). Should one array have been deleted or donated,
        each step is waited for on its own instead. Only jaxmon's own handles are waited on or asked, so a
        deletion at any moment makes the call raise, never crash."""
        if any(item.lost for item in batch):
            return [self._wait_arrays(item) for item in batch]
        handles = [h for item in batch for h in item.arrays]
        handles += [h for item in batch for h in item.figure_handles()]
        looked = self._clock()
        try:
            self.ops.wait(handles)
        except Exception:
            return [self._wait_arrays(item) for item in batch]
        newest = self._clock()
        ran = newest - looked >= BLOCKED
        later = [h[0] for h in list(self._handed) if h[0] < newest]  # handed while the newest ran: the host's lead
        # A call that came just after the newest completed, before this thread had the GIL back, reads as lead:
        # the least lead of the last looks is the loop's (a loop's lead is steady).
        self._leads.append(len(later))
        later = later[: min(self._leads)]
        start = self._last_done()
        if start is None:  # the first steps: no completion known before them, and no look before
            start, later, ran = batch[0].handed, [], True
        self._ran.append(ran)
        paced = 2 * sum(self._ran) > len(self._ran)  # the device behind the host at most recent looks
        completions: list[float | None] = list(apportion(start, newest, [i.handed for i in batch], later, ran, paced))
        return completions

    def _wait_arrays(self, item: Step) -> float | None:
        """When the step's ready arrays were all computed (None: unknown, one was deleted or donated first)."""
        figures = item.figure_handles()
        if item.lost:
            self._problem("unready", "a step's ready array was deleted or donated before step() was called")
            return None
        try:
            self.ops.wait(item.arrays + figures)
            return self._clock()
        except Exception as exc:
            error = exc
        if figures and not any(self.ops.deleted(h) for h in item.arrays):
            try:  # a figure array failed (it is read below): the ready arrays alone say when the step was done
                self.ops.wait(item.arrays)
                return self._clock()
            except Exception as exc:
                error = exc
        self._problem("unready", "a step's ready array was deleted or donated", detail=str(error)[:200])
        return None

    def _read(self, item: Step) -> int | None:
        """Read and check the step's number and figures into `item` (steps.read_figures)."""
        try:
            return read_figures(item, self.ops.value, self._problem)
        except Exception as exc:  # a bug here: this step is not booked, and the waiter goes on with the next
            self._problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")
            return None


def apportion(
    start: float, end: float, handed: Sequence[float], later: Sequence[float], ran: bool = True, paced: bool = True
) -> list[float]:
    """The completions of consecutive steps handed at `handed`, the one before the first completed at `start`;
    `end`: when the waiter saw the last one complete, `ran`: whether it still ran when the waiter looked (else it
    completed before `end`); `later`: when the steps handed after the last one, before `end`, were (the host's
    lead); `paced`: whether the device was behind the host at recent looks. Non-decreasing, within [start, end]."""
    n = len(handed)
    if n == 1:  # the completion seen (a step that was done already: when the waiter looked, at most LOOK late)
        return [end]
    if not ran and not paced and handed[0] >= start:  # the device keeps up with the host: each done once handed
        out, previous = [], start
        for time in handed:
            previous = min(max(time, previous), end)
            out.append(previous)
        return out
    times = [*handed, *later]
    shift = len(later) + 1  # a paced loop calls step() for step k + shift right after step k completed
    bounds = [times[i + shift] for i in range(n - 1)]
    # Not paced by the device: the host's calls came before the interval began, or in a burst long before its end
    # (it ran ahead): no rhythm of the device's to follow.
    if bounds[0] < start - (end - start) / n / 2 or end - bounds[-1] > 6 * (end - start) / n:
        span = max(end - start, 0.0) / n
        return [start + span * (i + 1) for i in range(n - 1)] + [end]
    out, previous = [], start
    for bound in bounds:
        previous = min(max(bound, previous), end)
        out.append(previous)
    if not ran:  # it completed before the look (the loop paused): a typical step after the one before it
        end = min(end, previous + (previous - start) / (n - 1))
    out.append(end)
    return out
