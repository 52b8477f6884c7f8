"""Which steps a sampled trace holds: blocks at the multiples of `every`, moved off steps with named badput.

A block starts at each step number that is a multiple of `every`, so every process of a job traces the same step
numbers. A trace of steps whose time holds named badput (an open `jaxmon.badput()` block, an Orbax save or
restore, a compilation) reads that badput as the step's idle or compute time: an eval every 100 steps runs right
after step 999, just before every default block. So such a sample is dropped (counted `skipped`) and tried again
on the next clean steps.

Step numbers only, so that every process of a job whose loop has the same cadence decides alike: an interval is placed
on the steps by the last step number handed to `jaxmon.step()` when it opened (or was recorded: a compilation, a save)
and when it closed. Badput after step `h` was handed delays step `h + 1`, whose window runs from step `h`'s completion
to its own: an interval that opened after `a - 1` and closed after `b - 1` was handed marks steps `a` to `b`. A block of
steps `n0` to `n0 + steps - 1` holds it when they meet, unless earlier intervals of its kind marked every step from
`n0 - LEAD` on too (a `badput("data")` around each step's batch: the loop's steady state, which a sample should show,
not dodge). The retry block is the first multiple of `steps + LEAD` at least `LEAD` steps past the last marked step (its
trace starts on the first step handed after the badput closed), at most MAX_RETRIES times after a regular block, and
only where it ends before the next regular block's trace starts, `lead` steps before it (else that one is tried
instead).

A trace is asked for `lead` steps before its block (LEAD, or more where the profiler is slow to start: the sampler's
lead). An interval that opens after that but before the block's first step marks the block only if it is still open
when it closes past the block's first step: an eval right after step `n0 - 3` marks step `n0 - 2`, not the block. One
open when the trace is asked for spans a hand-off already: it marks the block (a badput that long is likely to).

Not thread-safe: the sampler calls it with its lock held; `retry` alone is read without (jaxmon.step()'s check).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from jaxmon.sampled_traces import LEAD as LEAD  # re-exported: the hand and the sampler read it here

# Retries of a sample that held badput, after each regular block at most.
MAX_RETRIES = 3
INF = math.inf


def block_start(handed: int, every: int) -> int | None:
    """The first step of the regular block whose trace starts when step `handed` is handed, or None: blocks start at
    the multiples of `every` (the same in every process of a job)."""
    if every <= 0:
        return None
    n0 = handed + LEAD
    return n0 if n0 % every == 0 and n0 > 0 else None


def period_began(previous: int | None, wall_ns: int, min_seconds: float) -> tuple[bool, int]:
    """At most one sample per `min_seconds` of Unix time: whether a block starting at `wall_ns` is traced (a period
    began since the last block start, in period `previous`; None: the first block), and its period. Every process of
    a job sees a period begin between the same two block starts (but within their clocks' skew: such an edge block
    may differ once, the next period agrees again)."""
    period = wall_ns // max(round(min_seconds * 1e9), 1)
    return previous is None or period != previous, period


def traced_steps(n0: int, steps: int) -> range:
    """The step numbers of the block starting at `n0`."""
    return range(n0, n0 + steps)


class Blocks:
    """The block asked for, the badput marks on the steps, and the retry after a block that held some."""

    def __init__(self, every: int, steps: int) -> None:
        self.every = every
        self.steps = steps
        self.retry: int | None = None  # the next block to try, off the multiples of `every`
        self.block: int | None = None  # the latest block asked for, until its sample ends
        self._marked: set[int] = set()  # blocks whose steps hold named badput: their samples are dropped
        self._until = -INF  # the last step the latest block's closed badput marks
        self._holding: set[Hashable] = set()  # open intervals that mark the latest block
        self._retries = 0  # retry blocks asked for since the last regular one
        self._runs: dict[str, list[float]] = {}  # kind -> [first, last] step of its latest run of marked steps
        self._open: dict[Hashable, tuple[str, int]] = {}  # open intervals: key -> (kind, first marked step)
        # open intervals that began before the latest block: marks if they reach it
        self._pending: set[Hashable] = set()
        self.lead = LEAD  # how many steps before its block a trace is asked for (the sampler's)

    def begin(self, n0: int) -> bool:
        """The trace of the block `n0` is asked for; False when an interval still open already marks it."""
        self._retries = 0 if n0 % self.every == 0 else self._retries + 1
        self.retry = None
        self.block, self._until, self._holding, self._pending = n0, -INF, set(), set()
        for key, (kind, first) in list(self._open.items()):
            self._mark(kind, key, first, INF, asked=True)
        return n0 not in self._marked

    def marked(self, n0: int) -> bool:
        """Whether block `n0`'s steps hold named badput."""
        return n0 in self._marked

    def held(self, n0: int) -> bool:
        """Whether block `n0`'s steps hold named badput, an interval still open that began before it included (its
        steps all came: it spans them)."""
        return n0 in self._marked or (self.block == n0 and bool(self._pending))

    def finish(self, n0: int) -> None:
        """Block `n0`'s sample ended (taken, dropped, busy, failed): later intervals no longer mark it."""
        self._marked.discard(n0)
        if self.block == n0:
            self.block, self._pending = None, set()

    def opened(self, kind: str, key: Hashable, handed: int | None, whole: bool) -> None:
        """An interval of `kind` opened (or was recorded `whole`: it ended now) after step `handed` was handed."""
        first = (handed if handed is not None else -1) + 1
        last = first if whole else INF
        run = self._runs.get(kind)
        if run is not None and first <= run[1] + 1:
            run[1] = max(run[1], last)
        else:
            self._runs[kind] = [first, last]
        if not whole:
            self._open[key] = (kind, first)
        self._mark(kind, key, first, last)

    def closed(self, key: Hashable, handed: int | None) -> None:
        """The open interval `key` closed after step `handed` was handed."""
        found = self._open.pop(key, None)
        if found is None:
            return
        kind, first = found
        last = max((handed if handed is not None else -1) + 1, first)
        run = self._runs.get(kind)
        if run is not None and run[1] == INF and all(k != kind for k, _ in self._open.values()):
            run[1] = last
        if key in self._pending:  # began before the block: it marks it if it reached it
            self._pending.discard(key)
            if self.block is not None and last >= self.block:
                self._marked.add(self.block)
                self._until = max(self._until, last)
                if not self._holding:
                    self._plan(self._until)
        if key in self._holding:
            self._holding.discard(key)
            self._until = max(self._until, last)
            if not self._holding:
                self._plan(self._until)

    def _mark(self, kind: str, key: Hashable, first: float, last: float, asked: bool = False) -> None:
        n0 = self.block
        if n0 is None or last < n0 or first > n0 + self.steps - 1:
            return
        run = self._runs.get(kind)
        if run is not None and run[0] <= n0 - LEAD and first > run[0]:
            return  # intervals of this kind marked every step since before the trace's lead-in: the loop's cadence
        if last == INF and first < n0 and not asked:
            self._pending.add(key)  # opened in the lead: it marks the block if it closes past its first step
            return
        self._marked.add(n0)
        if last == INF:
            self._holding.add(key)
        else:
            self._until = max(self._until, last)
        if not self._holding:
            self._plan(self._until)

    def _plan(self, until: float) -> None:
        """The retry: its trace starts on a step handed after the badput that ends at step `until` closed."""
        self.retry = None
        if self._retries >= MAX_RETRIES:
            return
        size = self.steps + LEAD
        n0 = math.ceil((int(until) + LEAD) / size) * size
        if n0 + self.steps + self.lead <= (int(until) // self.every + 1) * self.every:  # ends before the next's lead-in
            self.retry = n0
