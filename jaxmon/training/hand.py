"""The training thread's side of the tracker, and its protocol with jaxmon's waiter thread (waiter.py).

`jaxmon.step` is the bound method of the process's one `Hand` (`HAND`): a step is one Python call. Each tracker arms
the hand as it starts (the newest gets the steps) and disarms it as it stops; a disarmed hand drops every step, with
one warning. Nothing here imports JAX: `ops` (the tracker's TrainingOps) does.

The protocol. The training thread only appends; every decision about a step is the waiter's. They share:
- `handed`, a deque: this thread appends a step and what comes with it in one extend(); the waiter pops from the
  left a count of items it read first (both atomic), never "until empty". In order, it holds:
  - a float: a step, handed at that time (the tracker's clock), numbered on from the step before, with its figures
    and tracked calls. Most steps are nothing else (a float is no object the cyclic GC tracks).
  - a `Given`: what the steps after it are given (the first's number, the figures, the tracked calls), NumPy
    scalars as Python numbers and JAX arrays as jaxmon's own handles on them; one with arrays is the hold of the
    step after it (they alone bound it). Handed before a step that does not follow on.
  - a `Hold`: jaxmon's own handles on the step just handed (its ready arrays, or a barrier's outputs, with its
    number's and figures' arrays), where the waiter asked (`asked`), once per `waiter.every` of this thread's time
    (`_due`) where the waiter took every hold handed before but the last (`holds`: a waiter running late is handed
    no pile of them, each keeping its step's arrays), or, `marked`, on the last step's when the host stopped
    stepping (pause(): a badput() block opens).
  - `PAUSED`: step() came `paused_after` or more after the step before: those before completed before it.
  - a `Done`: pause() found the last step's hold (or the one the waiter waits for) complete: the steps handed before
    it completed by its time (a badput() block opening next is on an idle device, however late the waiter wakes).
  - a `Found`: step() found the newest hold it handed complete, by its time (it looks at most once per GIL switch
    interval of its own time, until it is): that hold's step, and those before it, completed by then, not those
    handed since; the waiter reads it for the hold it waits for or one handed after it, so that a loop that called
    since is dated by its own call, however late the waiter wakes (or takes a step held while it was busy).
- written by the waiter only, read here: `asked` (a new object: hold the next step, then wake it), `waiting` (the hold
  it waits for, set before it pops a look's items, None once the wait returned), `paused_after`,
  `device_step` (the last number it read off a device), and its own `booked` (steps taken and booked: with this
  thread's `_count`, what `max_pending` bounds), `holds` (the Holds it took: with this thread's `_holds`), `every`,
  `room` (a step holding arrays hurries it once that many are pending: their objects would make the cyclic GC
  collect). `let_go()` is its call once the loop is still: the
  last step's ready (`_ready`, kept for pause()) goes.
- called here of the waiter: `wake()` and `hurry()` (an Event each). The sampler's `look_now()` (on this thread, in
  step()) sets `answered` (this thread's) so that the next step is held.
"""

from __future__ import annotations

import heapq
import numbers
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, SupportsFloat, SupportsIndex

import numpy as np
import structlog

from jaxmon.training.blocks import LEAD, Blocks
from jaxmon.training.handed import Program, TrainingOps
from jaxmon.training_readings import MAX_LOSS_NAMES

if TYPE_CHECKING:
    from jaxmon.training.sampler import Off, Sampler

log = structlog.get_logger("jaxmon.training")
_warned = False
NO_CALLS: tuple[()] = ()  # the tracked calls of a step that made none (shared)
HOST = frozenset({int, float, type(None)})  # step() arguments taken as they are
PAUSED = object()
LOST = object()  # an array deleted or donated before step() could hold it
_NO_BLOCKS = Blocks(0, 1)  # a disarmed hand's sampled blocks: no retry ever


class Given(NamedTuple):
    """What the steps handed after it are given; `arrays`: jaxmon's own handles among them (LOST: one it could not
    take), which are then the hold of the step handed after it."""

    number: Any
    examples: Any
    tokens: Any
    model_flops: Any
    calls: tuple[Program, ...]
    arrays: bool = False


class Hold(NamedTuple):
    """jaxmon's own handles on a step's arrays (clones sharing their buffers); `lost`: one was deleted or donated
    before step() could hold it; `loss`: the loss gauge's names of the first handles, `left_out` the names of its
    dict not held; `marked`: when the host stopped stepping (pause())."""

    handles: list[Any]
    lost: bool = False
    loss: tuple[str, ...] = ()
    marked: float | None = None
    left_out: int = 0


def handles(hold: Hold | Given) -> list[Any]:
    """What a hold waits on: a Hold's handles, a Given's arrays."""
    return hold.handles if type(hold) is Hold else [v for v in hold[:4] if v is not LOST and hasattr(v, "shape")]


class Done(NamedTuple):
    """The steps handed before it completed by `at` (pause() found a hold of theirs complete then)."""

    at: float


class Found(NamedTuple):
    """step() found `hold`, the newest it handed, complete by `at`: that hold's step and those before it only
    (steps handed since may still run)."""

    at: float
    hold: Any


class Waiting(Protocol):
    """The waiter as this thread sees it: what it writes, and its two wakes."""

    booked: int
    holds: int
    every: float
    room: int

    def wake(self) -> None: ...
    def hurry(self) -> None: ...


class _Idle:
    """A disarmed hand's waiter."""

    booked, holds, every, room = 0, 0, 0.0, 1

    def wake(self) -> None: ...
    def hurry(self) -> None: ...


def not_running(what: str, stacklevel: int = 3) -> None:
    """jaxmon.`what`() was called with no tracker running: said once (a RuntimeWarning at the caller's line)."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"jaxmon.{what}() does nothing before jaxmon.start() or jaxmon.publish(): call one of them first",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


class Hand:
    """step() and pause() on the training thread, for the tracker that armed it (`owner`)."""

    def __init__(self) -> None:
        self.owner: object | None = None
        self.waiter: Waiting = _Idle()
        self._sampler: Sampler | Off | None = None
        self.disarm()

    def arm(
        self,
        owner: object,
        ops: TrainingOps,
        clock: Callable[[], float],
        handed: deque[Any],
        waiter: Waiting,
        sampler: Sampler | Off,
        problem: Callable[..., None],
        max_pending: int,
    ) -> None:
        """Hand steps to `owner` from now on: a fresh start, nothing of the tracker before kept."""
        self.ops, self.waiter, self._sampler = ops, waiter, sampler
        self._problem, self._max_pending = problem, max_pending
        self._reset(clock, handed)
        # The sampler's check, copied (no sampler object read a step): its watch is set only by handed(), called
        # here; its blocks' `retry` by other threads.
        self._modulus, self._watch, self._blocks = sampler.modulus, sampler.watch, sampler.blocks
        self._lead = sampler.lead
        self.owner = owner  # last: armed

    def disarm(self, owner: object | None = None) -> None:
        """Drop every step from now on (`owner`: only if that tracker is the one armed), holding nothing of the loop.
        A step() under way meanwhile appends to the stopped tracker's deque, or to one that keeps nothing."""
        if owner is not None and owner is not self.owner:
            return
        self.owner = None
        self.waiter, self._sampler = _Idle(), None
        self._modulus, self._watch, self._blocks, self._lead = 0, -1, _NO_BLOCKS, LEAD
        self._problem, self._max_pending = _ignore, 0
        self._reset(time.monotonic, deque(maxlen=0))

    def _reset(self, clock: Callable[[], float], handed: deque[Any]) -> None:
        self._clock, self._handed = clock, handed
        self.calls: tuple[Program, ...] = NO_CALLS  # tracked calls since the last step(), one entry a call
        self.stepping = False  # step() was called: a process that never does exports no training series
        self.asked: object = None  # the waiter's
        self.answered: object = None  # this thread's: the last ask held
        self.paused_after = float("inf")  # the waiter's
        self.device_step: int | None = None  # the waiter's
        self.waiting: Hold | Given | None = None  # the waiter's: the newest hold it waits for (in _take)
        self._watched: Hold | Given | None = None  # the newest hold handed, until found complete
        self._checked: Hold | Given | None = None  # the last hold step() looked at
        self._recheck = float("inf")  # when step() looks at it again (inf: found complete)
        # Until the newest hold handed is complete, step() looks whether it is at most once per the GIL's switch
        # interval of its own time (the waiter's own wake is no finer): one call into JAX, on jaxmon's own handles,
        # per this much of the loop's time at most, and none once it is (a hold is handed once per look).
        self._recheck_every = sys.getswitchinterval()
        self._due = -float("inf")  # a step is held from then on anyway
        self._ready: tuple[Any, ...] = ()
        # What the next step may follow on from: the last host number (None: a Given next), the figures as given and
        # as the waiter reads them, the tracked calls.
        self._last: int | None = None
        self._examples = self._tokens = self._model_flops = None
        self._figures: list[Any] = [None, None, None]
        self._calls: tuple[Program, ...] = NO_CALLS
        self._previous = float("inf")  # when step() was last called
        self._count = 0  # steps handed
        self._holds = 0  # holds handed (a due one only where the waiter took all but the last: waiter.holds)

    @property
    def last_handed(self) -> float:
        """When step() was last called (the tracker's clock; -inf: never)."""
        return self._previous if self._previous < float("inf") else -float("inf")

    @property
    def dispatched(self) -> int | None:
        """The last step number handed to step(): a host one, or the last one the waiter read off a device."""
        return self._last if self._last is not None else self.device_step

    def step(
        self,
        n: SupportsIndex,
        *ready: Any,
        examples: SupportsFloat | None = None,
        tokens: SupportsFloat | None = None,
        model_flops: SupportsFloat | None = None,
    ) -> None:
        """Mark the end of training step `n`: it is complete when the JAX arrays in `ready` (any pytree: the loss,
        the metrics, never a donated buffer) are, or without any, when a tiny barrier on every local device is.

        The figures are the **job's** for the step (the global batch, its tokens, its model FLOPs); each process
        exports its share. `n` is an integer and a figure a finite number >= 0, each a Python, NumPy or JAX one;
        anything else is dropped for the step and counted (reason="invalid"). A JAX array is read once computed,
        never here, and alone says when its step completed; deleting or donating any array afterwards is safe.
        Returns at once: no device wait, no JAX call on the common path (a step that follows on is one float
        appended to a deque; until the newest hold is found complete, at most once per GIL switch interval a
        readiness check of jaxmon's own handles); never raises. Without a running start() or publish(): nothing
        (one warning)."""
        try:
            handed = self._clock()
            if (watched := self._watched) is not None and (watched is not self._checked or handed >= self._recheck):
                self._done_by(watched, handed)
            previous, self._previous = self._previous, handed
            calls = self.calls
            self.calls = NO_CALLS
            if (
                type(n) is int  # a host int (never an array's ==), the next one, with the same figures and calls
                and n - 1 == self._last
                and examples is self._examples
                and tokens is self._tokens
                and model_flops is self._model_flops
                and (calls is self._calls or calls == self._calls)  # programs compare by identity
                and handed - previous < self.paused_after
                and self._count - self.waiter.booked < self._max_pending
            ):
                self._count += 1
                self._last = n
                self._ready = ready
                if self.asked is self.answered and (handed < self._due or self._holds - self.waiter.holds > 1):
                    self._handed.append(handed)
                else:  # held (a look's step, or one per `every`: a loop of long steps, each): its time and hold
                    self._held(handed, ready)
                modulus = self._modulus  # the sampler's check: a call only where a trace may start or stop
                if modulus and ((n + self._lead) % modulus == 0 or n == self._watch or self._blocks.retry is not None):
                    self._sampled(n)
                return
            self._step(handed, previous, n, ready, (examples, tokens, model_flops), calls)
        except Exception as exc:  # never into training
            log.warning("jaxmon.step failed; the step is not tracked", error=f"{type(exc).__name__}: {exc}")

    def _held(self, handed: float, ready: tuple[Any, ...]) -> None:
        """A step that follows on, held: its time and its Hold, and the waiter woken where it asked."""
        asked = self.asked
        self._due = handed + self.waiter.every
        self._watched = hold = self._hold(ready)
        self._handed.extend((handed, hold))
        self._holds += 1
        if asked is not self.answered:
            self.answered = asked
            self.waiter.wake()

    def called(self, program: Program) -> None:
        """A tracked function ran `program` once in the current step (jaxmon.track()'s wrapper)."""
        calls = self.calls
        self.calls = program.once if calls is NO_CALLS else (*calls, program)

    def _step(
        self, handed: float, previous: float, n: Any, ready: tuple[Any, ...], given: tuple[Any, Any, Any],
        calls: tuple[Program, ...],
    ) -> None:  # fmt: skip
        """step()'s other path: a step that does not follow on, with NumPy or JAX values, held, or after a pause."""
        if self.owner is None:
            not_running("step", stacklevel=4)  # the caller of jaxmon.step()
            return
        self.stepping = True
        if self._count - self.waiter.booked >= self._max_pending:
            self._last = None
            self._problem("dropped", "training steps not tracked: the waiter is far behind", number=shown(n))
            return
        items: list[Any] = [PAUSED] if handed - previous >= self.paused_after else []
        values: list[Any] = []
        held: list[Any] = []
        for value in (n, *given):
            if type(value) not in HOST:
                if isinstance(value, np.integer):
                    value = int(value)
                elif isinstance(value, np.floating):
                    value = float(value)
                elif self.ops.is_array(value):
                    value = self.ops.hold(value)
                    value = LOST if value is None else value
                    if value is not LOST:
                        held.append(value)
            values.append(value)
        number, *figures = values
        host = type(number) is int and not held and not any(v is LOST for v in values)
        if not (host and number - 1 == self._last and calls == self._calls and all(map(_same, figures, self._figures))):
            items.append(Given(number, figures[0], figures[1], figures[2], calls, bool(held)))
        items.append(handed)
        asked = self.asked
        if asked is not self.answered or (handed >= self._due and self._holds - self.waiter.holds <= 1):
            self._due = handed + self.waiter.every
            hold = self._hold(ready)
            self._holds += 1
            self._watched = hold = hold._replace(handles=hold.handles + held) if held else hold
            items.append(hold)
        elif held:
            self._watched = items[-2]  # the Given: its arrays are the step's hold
        self._handed.extend(items)  # one call: the waiter never takes a step without its Given and Hold
        self._count += 1
        if asked is not self.answered:
            self.answered = asked
            self.waiter.wake()
        elif held and self._count - self.waiter.booked >= self.waiter.room:
            self.waiter.hurry()
        self._last = number if type(number) is int else None
        self._examples, self._tokens, self._model_flops = given if host else (None, None, None)
        self._figures, self._calls, self._ready = figures, calls, ready
        if type(number) is int:
            self._sampled(number)  # (a device number starts no sampled trace: it is not read here)

    def _sampled(self, number: int) -> None:
        """Step `number` told to the sampler, where a sampled trace may start or stop."""
        if (sampler := self._sampler) is not None:
            sampler.handed(number)
            self._watch, self._lead = sampler.watch, sampler.lead

    def _hold(self, ready: tuple[Any, ...], marked: float | None = None) -> Hold:
        """jaxmon's own handles on `ready`'s arrays (here, where nothing deletes them meanwhile), or a barrier's when
        it has none. Of a dict of more scalars than the loss gauge exports, only those it exports (the first, sorted):
        any output of a step says when it completed."""
        ops = self.ops
        left_out = 0
        tree = ready[0] if len(ready) == 1 else None
        if type(tree) is dict and len(tree) > MAX_LOSS_NAMES and all(type(k) is str for k in tree):
            ready, left_out = ({k: tree[k] for k in heapq.nsmallest(MAX_LOSS_NAMES, tree)},), len(tree) - MAX_LOSS_NAMES
        arrays = ops.arrays(ready)
        if not arrays:
            return Hold(ops.barrier(), marked=marked)
        handles = [h for h in map(ops.hold, arrays) if h is not None]
        if len(handles) < len(arrays):
            return Hold(handles, lost=True, marked=marked)
        return Hold(handles, loss=loss_names(ready, arrays), marked=marked, left_out=left_out)

    def pause(self) -> None:
        """No step comes for a while (a badput() block opens): the last step held now (a mark), so that the steps
        before it are seen complete when they were; a `Done` where its hold (or the one the waiter waits for) is
        complete already: a loaded machine schedules the waiter milliseconds after the loop's own wait returned, and
        the block opening next must not read as the device's time."""
        if self.owner is None:
            return
        try:
            last = self._handed[-1]
        except IndexError:  # none handed since the waiter took them (it pops them meanwhile)
            last = None
        if type(last) is Done:
            return  # said already (a block opened inside another)
        made = last is not None and type(last) is not Hold
        hold = self.waiting if last is None else last if not made else self._hold(self._ready, marked=self._clock())
        items: list[Any] = [hold] if made else []
        if hold is not None:
            try:  # jaxmon's own handles: never emptied by a delete(), so this never crashes (a donated one raises)
                if self.ops.ready(handles(hold)):
                    items.append(Done(self._clock()))
            except Exception:
                pass
        if made:
            self._ready = ()
            self._holds += 1
        if items:
            self._handed.extend(items)
            self.waiter.hurry()

    def _done_by(self, hold: Hold | Given, now: float) -> None:
        """The newest hold handed, looked at (at most once per `_recheck_every` of this thread's time): complete
        already, its step completed by now. A loaded machine schedules the waiter milliseconds after the completion,
        where the loop has called since (it waited for the step, or ran on): a Found dates that step by this call,
        not by the waiter's late wake. A hold is kept here only until it is found complete, or the loop goes still."""
        self._checked, self._recheck = hold, now + self._recheck_every
        try:  # jaxmon's own handles: never emptied by a delete(), so this never crashes (a donated one raises)
            if self.ops.ready(handles(hold)):
                self._handed.append(Found(self._clock(), hold))
                self._watched = self._checked = None
        except Exception:
            self._watched = self._checked = None

    def let_go(self) -> None:
        """Hold nothing of a still loop (the waiter's call)."""
        self._ready = ()
        self._watched = self._checked = None


def _same(value: Any, before: Any) -> bool:
    """Whether a figure equals the step before's: the same type, a host number (never an array's ==)."""
    return type(value) is type(before) and (value is before or (type(value) in HOST and value == before))


def loss_names(ready: tuple[Any, ...], arrays: list[Any]) -> tuple[str, ...]:
    """The loss gauge's names for `ready`'s arrays (in its leaves' order): `loss` for one scalar, a dict's keys for
    a dict of scalars (flattened in key order); none for anything else."""
    if len(ready) != 1 or not all(getattr(a, "shape", None) == () for a in arrays):
        return ()
    tree = ready[0]
    if len(arrays) == 1 and tree is arrays[0]:
        return ("loss",)
    if type(tree) is dict and len(tree) == len(arrays) and all(type(k) is str for k in tree):
        keys = sorted(tree)
        if all(tree[k] is a for k, a in zip(keys, arrays, strict=True)):
            return tuple(keys)
    return ()


def shown(value: Any) -> str:
    """What was given, for a log line: a host value's repr (cut short), an array's type and shape only (its repr
    would wait for the device)."""
    shape = getattr(value, "shape", None)
    if (
        isinstance(value, str | numbers.Number)
        or value is None
        or (shape is not None and not hasattr(value, "block_until_ready"))
    ):
        try:
            return repr(value)[:80]
        except Exception:
            pass
    return f"{type(value).__name__} of shape {shape}" if shape is not None else type(value).__name__


def _ignore(*args: Any, **kwargs: Any) -> None:
    pass


HAND = Hand()  # the process's: jaxmon.step is its bound method
