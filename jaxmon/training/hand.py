"""The training thread's side of the tracker, and the protocol between it and jaxmon's waiter thread (waiter.py).

`jaxmon.step` is the bound method of the process's one `Hand` (`HAND`): a step is one Python call. Each tracker arms
the hand as it starts (the newest one gets the steps) and disarms it as it stops; a disarmed hand drops every step
with a warning, once, that jaxmon is not running. Nothing here imports JAX: `ops` (the tracker's `TrainingOps`) does.

The protocol. The training thread (step(), pause(), jaxmon.track()'s wrapper through `calls`) only appends; every
decision about a step is the waiter's. They share:

- `handed`, a deque: this thread appends to its right (a step and what comes with it in one extend()), the waiter
  pops from its left (both atomic); the waiter takes a count of items it read first, never "until empty". In
  order, it holds:
  - a float: a step, handed at that time (the tracker's clock). Its number is the step before's + 1, its figures
    and tracked calls the step before's. This is a step's one representation here: most steps are nothing else
    (a float is no object Python's cyclic GC tracks).
  - a `Given`: what the steps after it are given (the first one's number, the figures, the tracked calls), as
    given, each NumPy scalar a Python number and each JAX array a `Held` (jaxmon's own handle, read by the waiter
    once its step is done). Handed before a step that does not follow on.
  - a `Hold`: jaxmon's own handles on the step just handed, which the waiter waits on: its JAX number and figures
    where it has some (they alone bound it), else its ready arrays (only where the waiter asked), or a barrier's;
    with `marked` set, the last step's, handed when the host stopped stepping (a badput() block opened).
  - `PAUSED`: step() came a pause after the step before (`paused_after`): the steps before it completed before the
    step after it was handed.
- `asked`, written by the waiter only: a new object when it wants the next step held; this thread holds the next
  step and keeps the object it answered (`answered`, its own: the sampler's `look_now()`, on this thread, sets it
  to ask too), then wakes the waiter.
- `waiter.every`, written by the waiter only: this thread also holds a step that long after the last one it held
  (`_due`, its own), so that a loop that stops leaves at most that much of its steps without a hold.
- `paused_after`, written by the waiter only: how long after the step before a step() hands PAUSED first.
- `device_step`, written by the waiter only: the last step number it read off a device (a step given as an array).
- `waiter.booked`, written by the waiter only: the steps it took off `handed` and booked (or dropped); the steps
  handed (`_count`, this thread's) less those are what `max_pending` bounds (a step past it is dropped, counted).
- `let_go()`: the waiter's call once the loop is still; it drops the last step's ready (`_ready`, this thread's
  otherwise): jaxmon holds no array of a loop that stopped. A step() meanwhile may have set a newer one, which a
  pause() then cannot hold (its steps are dated as a paused loop's).
Everything else here is this thread's alone. The training thread calls nothing of the waiter's but `wake()` and
`hurry()`, which set an Event.
"""

from __future__ import annotations

import heapq
import numbers
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
# The tracked calls of a step that made none (shared: never appended to).
NO_CALLS: tuple[()] = ()
# Host types a step() argument may be as it is (checked first: the common case costs no more); NumPy scalars are
# made Python numbers (one C call each), anything else is checked by the waiter.
HOST = frozenset({int, float, type(None)})
NUMPY_INT, NUMPY_REAL = np.integer, np.floating


class Held(NamedTuple):
    """A number given to step() as a JAX array: jaxmon's own handle on it (None: deleted or donated already)."""

    handle: Any


class Given(NamedTuple):
    """What the steps handed after it are given: the first one's number (the next ones count on), the figures
    (None: not given) and the tracked calls of each."""

    number: Any
    examples: Any
    tokens: Any
    model_flops: Any
    calls: tuple[Program, ...]


class Hold(NamedTuple):
    """What the waiter waits on for a step: jaxmon's own handles (a clone of each array, sharing its buffers);
    `lost`: one was deleted or donated before step() could hold it; `loss`: the loss gauge's names of the first
    handles (ready was a scalar or a dict of scalars); `marked`: when the host stopped stepping (pause())."""

    handles: list[Any]
    lost: bool = False
    loss: tuple[str, ...] = ()
    marked: float | None = None
    left_out: int = 0  # names of the loss dict not held (past the loss gauge's MAX_LOSS_NAMES)


PAUSED = object()
_NO_BLOCKS = Blocks(0, 1)  # a disarmed hand's: no retry ever


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


class Waiting(Protocol):
    """The waiter as this thread sees it (waiter.py): what it writes, and its two wakes."""

    booked: int
    every: float

    def wake(self) -> None: ...
    def hurry(self) -> None: ...


class _Idle:
    """A disarmed hand's waiter: nothing to wake."""

    booked = 0
    every = 0.0

    def wake(self) -> None: ...
    def hurry(self) -> None: ...


class Hand:
    """step() and pause() on the training thread, for the tracker that armed it (`owner`)."""

    def __init__(self) -> None:
        self.owner: object | None = None
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
        """Hand steps to `owner` (a tracker) from now on: a fresh start, nothing of the tracker before kept."""
        self.ops = ops
        self.waiter: Waiting = waiter
        self._sampler: Sampler | Off | None = sampler
        self._problem = problem
        self._max_pending = max_pending
        self._reset(clock, handed)
        # The sampler's check, copied here (no sampler object read a step): its modulus (0: sampled traces off) and
        # its watch (set by sampler.handed() alone, called here: copied after each call); its blocks' `retry` is
        # set by other threads.
        self._modulus = sampler.modulus
        self._watch = sampler.watch
        self._blocks = sampler.blocks
        self.owner = owner  # last: armed

    def disarm(self, owner: object | None = None) -> None:
        """Drop every step from now on (`owner`: only if that tracker is the one armed), holding nothing of the loop.
        A step() under way meanwhile appends to the stopped tracker's deque or to one that keeps nothing."""
        if owner is not None and owner is not self.owner:
            return
        self.owner = None
        self.waiter = _Idle()
        self._sampler = None
        self._modulus, self._watch, self._blocks = 0, -1, _NO_BLOCKS
        self._problem = _ignore
        self._max_pending = 0
        self._reset(time.monotonic, deque(maxlen=0))

    def _reset(self, clock: Callable[[], float], handed: deque[Any]) -> None:
        self._clock = clock
        self._handed = handed
        self.calls: tuple[Program, ...] = NO_CALLS  # tracked calls since the last step(), one entry a call
        self.stepping = False  # step() was called: a process that never does exports no training series
        self.asked: object = None  # the waiter's (see the protocol)
        self.answered: object = None  # the last ask held (this thread's)
        self._due = -float("inf")  # when a step is held anyway: the waiter's `every` after the last hold
        self.paused_after = float("inf")  # the waiter's
        self.device_step: int | None = None  # the waiter's
        self._ready: tuple[Any, ...] = ()  # the last step's ready, for pause(); the waiter never touches it
        # The context the next step may follow on from: the last host step number (None: the next step hands a
        # Given), the figures as given and the tracked calls.
        self._last: int | None = None
        self._examples: Any = None
        self._tokens: Any = None
        self._model_flops: Any = None
        self._calls: tuple[Program, ...] = NO_CALLS
        self._figures: list[Any] = [None, None, None]  # the figures as the waiter reads them
        self._previous = float("inf")  # when step() was last called (none yet: no pause before)
        self._count = 0  # steps handed

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
        the metrics, never a donated buffer) are; with no array in `ready`, when a tiny barrier on every local device
        is.

        Every process passes the **job's** figures for the step: `examples` the global batch, `tokens` its tokens,
        `model_flops` its model FLOPs (6·N·tokens for a transformer). Each process exports its share (examples and
        tokens / jax.process_count(), FLOPs / jax.device_count() on each local device), so sum() over the job's
        series is the job's total.

        `n` must be an integer (Python, NumPy or JAX; not a float, not a bool), a figure a finite number >= 0
        (Python, NumPy or JAX): anything else is dropped for that step and counted as
        `jaxmon_training_tracking_problems_total{reason="invalid"}` (logged once per field). A JAX array is read by
        jaxmon's waiter once it is computed, never here, and it alone says when its step completed; deleting,
        donating or reusing any array afterwards is safe (the step counts `unready`, the figure `unread`). Returns
        at once: no device wait, no JAX call on the common path (a step that follows on: one float appended to a
        deque); never raises into training. Without a running `jaxmon.start()` or `jaxmon.publish()` it does
        nothing (one warning)."""
        try:
            handed = self._clock()
            previous, self._previous = self._previous, handed
            calls = self.calls
            self.calls = NO_CALLS
            if (
                type(n) is int  # a host int (never an array's ==), the next one, with the same figures and calls
                and n - 1 == self._last
                and examples is self._examples
                and tokens is self._tokens
                and model_flops is self._model_flops
                and (calls is self._calls or calls == self._calls)  # a tuple of programs (compared by identity)
                and self.asked is self.answered
                and handed < self._due
                and handed - previous < self.paused_after
                and self._count - self.waiter.booked < self._max_pending
            ):
                self._count += 1
                self._last = n
                self._ready = ready
                self._handed.append(handed)
                modulus = self._modulus  # the sampler's check inlined: a call only where a trace may start or stop
                if modulus and ((n + LEAD) % modulus == 0 or n == self._watch or self._blocks.retry is not None):
                    self._sampled(n)
                return
            self._step(handed, previous, n, ready, (examples, tokens, model_flops), calls)
        except Exception as exc:  # never into training
            log.warning("jaxmon.step failed; the step is not tracked", error=f"{type(exc).__name__}: {exc}")

    def called(self, program: Program) -> None:
        """A tracked function ran `program` once in the current step (the training thread: jaxmon.track()'s wrapper
        inlines the first call's case)."""
        calls = self.calls
        self.calls = program.once if calls is NO_CALLS else (*calls, program)

    def _step(
        self,
        handed: float,
        previous: float,
        n: Any,
        ready: tuple[Any, ...],
        given: tuple[Any, Any, Any],
        calls: tuple[Program, ...],
    ) -> None:
        """step()'s other path: a step that does not follow on, whose values are NumPy or JAX numbers, that the waiter
        asked for, or that comes after a pause."""
        if self.owner is None:
            not_running("step", stacklevel=4)  # the caller of jaxmon.step(), through step() and this
            return
        self.stepping = True
        if self._count - self.waiter.booked >= self._max_pending:
            self._last = None  # the next step hands a Given: the waiter does not know this one
            self._problem("dropped", "training steps not tracked: the waiter is far behind", number=shown(n))
            return
        items: list[Any] = [PAUSED] if handed - previous >= self.paused_after else []
        number, *figures = values = [self._host(v) for v in (n, *given)]
        held = [v.handle for v in values if type(v) is Held and v.handle is not None]
        host = type(number) is int and not any(type(v) is Held for v in values)
        if not (host and number - 1 == self._last and calls == self._calls and all(map(_same, figures, self._figures))):
            items.append(Given(number, figures[0], figures[1], figures[2], calls))
        items.append(handed)
        asked = self.asked
        if asked is not self.answered or handed >= self._due:  # the waiter's: ready held, the arrays given too
            self._due = handed + self.waiter.every
            hold = self._hold(ready)
            items.append(hold._replace(handles=hold.handles + held) if held else hold)
        elif held:  # a number or figure given as an array bounds its step: only it is held
            items.append(Hold(held))
        self._handed.extend(items)  # one call: the waiter never takes a step without its context and hold
        self._count += 1
        if asked is not self.answered:
            self.answered = asked
            self.waiter.wake()
        self._last = number if type(number) is int else None  # (a device number: the next step hands a Given)
        if host:
            self._examples, self._tokens, self._model_flops = given
            self._figures = figures
        else:  # figures read per step: the next step hands a Given
            self._examples = self._tokens = self._model_flops = None
        self._calls = calls
        self._ready = ready
        if type(number) is int:
            self._sampled(number)  # a device step number starts no sampled trace (it is not read here)

    def _host(self, value: Any) -> Any:
        """A step() argument as the waiter reads it: a Python number as given, a NumPy scalar as a Python number, a
        JAX array as jaxmon's own handle on it (Held), anything else as given (the waiter checks it)."""
        if type(value) in HOST:
            return value
        if isinstance(value, NUMPY_INT):
            return int(value)
        if isinstance(value, NUMPY_REAL):
            return float(value)
        if self.ops.is_array(value):
            return Held(self.ops.hold(value))
        return value

    def _sampled(self, number: int) -> None:
        """Step `number` handed to the sampler, where a sampled trace may start or stop; its watch copied."""
        sampler = self._sampler
        if sampler is not None:
            sampler.handed(number)
            self._watch = sampler.watch

    def _hold(self, ready: tuple[Any, ...], marked: float | None = None) -> Hold:
        """jaxmon's own handles on `ready`'s arrays (on the training thread, where nothing deletes them meanwhile),
        or a barrier's when it holds none; the loss gauge's names where `ready` is a scalar or a dict of scalars."""
        ops = self.ops
        left_out = 0
        if len(ready) == 1 and type(ready[0]) is dict and len(ready[0]) > MAX_LOSS_NAMES:
            # Only the names the loss gauge exports are held and read (the first, sorted): any output of the step
            # says when it completed, and a dict of a thousand metrics costs what one of sixteen does.
            tree = ready[0]
            if all(type(k) is str for k in tree):
                ready = ({k: tree[k] for k in heapq.nsmallest(MAX_LOSS_NAMES, tree)},)
                left_out = len(tree) - MAX_LOSS_NAMES
        arrays = ops.arrays(ready)
        if not arrays:  # no ready, or a tree of host numbers: no array says when the step is done
            return Hold(ops.barrier(), marked=marked)
        handles = [h for h in map(ops.hold, arrays) if h is not None]
        if len(handles) < len(arrays):
            return Hold(handles, lost=True, marked=marked)
        return Hold(handles, loss=loss_names(ready, arrays), marked=marked, left_out=left_out)

    def pause(self) -> None:
        """No step comes for a while (a badput() block opens, an epoch ends: on the training thread). The last step's
        arrays are held now (a mark), so that the steps before it are seen complete when they were, not after."""
        if self.owner is None:
            return
        try:
            last = self._handed[-1]
        except IndexError:
            return  # nothing handed, or the waiter took everything
        if type(last) is Hold:
            return  # the last step is held already
        self._handed.append(self._hold(self._ready, marked=self._clock()))
        self._ready = ()
        self.waiter.hurry()

    def let_go(self) -> None:
        """Hold nothing of the loop (the waiter's call once the loop is still: the last step's ready goes)."""
        self._ready = ()


def _same(value: Any, before: Any) -> bool:
    """Whether a host figure equals the step before's (the same type: never an array's ==)."""
    return type(value) is type(before) and (value is before or value == before)


def loss_names(ready: tuple[Any, ...], arrays: list[Any]) -> tuple[str, ...]:
    """The loss gauge's names for `ready`'s arrays (in its leaves' order): `loss` for one scalar, a dict's keys for
    a dict of scalars (JAX flattens a dict in key order); none for anything else."""
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
    """What was given, for a log line: a host value's repr (cut short), an array's type only (its repr would wait
    for the device)."""
    if isinstance(value, str | numbers.Number) or value is None:
        return repr(value)[:80]
    shape = getattr(value, "shape", None)
    if shape is not None and not hasattr(value, "block_until_ready"):
        try:
            return repr(value)[:80]
        except Exception:
            pass
    return f"{type(value).__name__} of shape {shape}" if shape is not None else type(value).__name__


def _ignore(*args: Any, **kwargs: Any) -> None:
    pass


# The process's hand: jaxmon.step is its bound method (jaxmon.training).
HAND = Hand()
