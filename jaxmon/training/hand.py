"""The training thread's side of the tracker: `step()` hands each step to the waiter (waiter.py), `pause()` marks
that no step comes for a while, and `jaxmon.track()`'s wrapper notes its calls in `calls`: the current step's
tracked programs, a tuple (one call of one program: that program's `once`, made once; no list a step to make or
empty, no object a step the cyclic GC tracks).

On the common path a step is one float appended to a deque (atomic under the GIL: no lock, no JAX call, no notify,
no object Python's cyclic GC tracks): a step that follows on from the one before (steps.py). Any other step is a
Handoff tuple: the one the waiter asks to look at (jaxmon's own handles on its ready arrays, `ops.hold`: a clone of
each, sharing its buffers), one whose number or figures are JAX arrays (handles on them, read by the waiter once the
step is done), or one that changes the figures or tracked calls. Nothing here imports JAX: `ops`
(jaxmon.sources.local.training.JaxTraining) does that.
"""

from __future__ import annotations

import numbers
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex

import structlog

from jaxmon.training.blocks import LEAD
from jaxmon.training.handed import Program, TrainingOps
from jaxmon.training.sampler import Off
from jaxmon.training.steps import MARK, NO_CALLS, PLAIN, RESUMED, Held, Hold, Item, held, loss_names, shown

if TYPE_CHECKING:
    from jaxmon.training.sampler import Sampler
    from jaxmon.training.waiter import Waiter

log = structlog.get_logger("jaxmon.training")
_warned = False


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


class _Idle:
    """A disarmed hand's waiter: it wants every step looked at, so that each goes to `_step`, which drops it."""

    want = True
    taken = 0
    every = 0.0
    resumed_after = 0.0

    def wake(self) -> None: ...
    def hurry(self) -> None: ...


_OFF = Off()


class Hand:
    """step() and pause() on the training thread, for the tracker that armed it: `handed` is the deque the waiter
    takes steps from; `problem(reason, event, ...)` the tracker's count and log.

    The process has one (`HAND`, below): `jaxmon.step` is its bound method, so that a step is one Python call, no
    function in front of it (130-440 ns less a step, hot, here: BENCHMARKS.md). Each tracker arms it as it starts
    (`Tracker(...)`: the newest is the one step() feeds, as jaxmon.training's activate() makes one at a time) and
    disarms it as it stops; a disarmed hand drops every step with a warning, once, that jaxmon is not running."""

    def __init__(self) -> None:
        self.owner: object | None = None
        self.disarm()

    def arm(
        self,
        owner: object,
        ops: TrainingOps,
        clock: Callable[[], float],
        handed: deque[Item],
        waiter: Waiter,
        sampler: Sampler | Off,
        problem: Callable[..., None],
        max_pending: int,
    ) -> None:
        """Hand steps to `owner` (a tracker) from now on: a fresh start, nothing of the tracker before kept."""
        self.ops = ops
        self.waiter: Waiter | _Idle = waiter
        self.sampler: Sampler | Off = sampler
        self._problem = problem
        self._max_pending = max_pending
        self._reset(clock)
        # The sampler's check, on this object (no sampler object read a step): its modulus (constant; 0: sampled
        # traces off, no check at all), its watch (set by sampler.handed() alone, called here: copied after each
        # call) and its blocks, whose `retry` another thread may set.
        self._modulus = sampler.modulus
        self._watch = sampler.watch
        self._blocks = sampler.blocks
        self._handed: deque[Item] = handed
        self.owner = owner  # last: armed

    def disarm(self, owner: object | None = None) -> None:
        """Drop every step from now on (`owner`: only if that tracker is the one armed), holding none of the loop's
        arrays or steps (the tracker's `ops` stay until the next arm). A step() under way on the training thread
        meanwhile appends to the stopped tracker's deque or to one that keeps nothing: neither is read again."""
        if owner is not None and owner is not self.owner:
            return
        self.owner = None
        self._handed = deque(maxlen=0)  # appends nothing
        self.waiter = _Idle()
        self.sampler = _OFF
        self._modulus, self._watch, self._blocks = 0, -1, _OFF.blocks
        self._problem = _ignore
        self._max_pending = 0
        self._reset(time.monotonic)

    def _reset(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.calls: tuple[Program, ...] = NO_CALLS  # tracked calls since the last step(), one entry a call
        self.stepping = False  # step() was called: a process that never does exports no training series
        self.dispatched: int | None = None  # the last step number handed to step() (the waiter sets a device one)
        self._last_ready: tuple[Any, ...] = ()  # the last step's ready (pause() holds it: the training thread's)
        self._due = -float("inf")  # when step() next takes a step's handles, a look's time after it last did
        # The step a step may follow on from (steps.py): its number (None: none), its figures and calls.
        self._last: int | None = None
        self._examples: Any = None
        self._tokens: Any = None
        self._model_flops: Any = None
        self._programs: tuple[Program, ...] = NO_CALLS
        self._previous = float("inf")  # when step() was last called (the tracker's clock; none yet: no pause before)

    def step(
        self,
        n: SupportsIndex,
        *ready: Any,
        examples: SupportsFloat | None = None,
        tokens: SupportsFloat | None = None,
        model_flops: SupportsFloat | None = None,
    ) -> None:
        """Mark the end of training step `n`: it is complete when the JAX arrays in `ready` (any pytree: the
        loss, the metrics, never a donated buffer) are; with no array in `ready` (none given, or only host numbers),
        when a tiny barrier on every local device is (a few dispatches per step on the training thread).

        Every process passes the **job's** figures for the step, what one step of the whole job processes:
        `examples` the global batch, `tokens` its tokens, `model_flops` its model FLOPs (6·N·tokens for a
        transformer). Each process exports its share (examples and tokens / jax.process_count(), FLOPs /
        jax.device_count() on each local device), so sum() over the job's series is the job's total, as with every
        Prometheus counter.

        `n` and the figures may be JAX arrays still being computed (a TrainState's step, the batch's token count):
        jaxmon reads them on its own thread once the step is done, never here. `n` must be an integer
        (Python, NumPy or JAX; not a float, not a bool), a figure a finite number >= 0: anything else is dropped for
        that step and counted as `jaxmon_training_tracking_problems_total{reason="invalid"}` (logged once per
        field). Deleting, donating or reusing any of these arrays afterwards is safe: the step is counted
        `unready`, or the figure `unread`. Returns at once (it notes the time and queues the step: no device wait,
        no conversion); never raises into training. Without a running `jaxmon.start()` or `jaxmon.publish()` it
        does nothing (one warning).

        No lock, no JAX call, no notify on the common path: a step that follows on (the next number, the same
        figures and tracked calls, no look due) is its hand-off time appended to a deque (atomic; steps.py), any
        other one a tuple (`_step`)."""
        number: Any = n
        try:
            handed = self._clock()
            previous, self._previous = self._previous, handed
            calls = self.calls
            self.calls = NO_CALLS
            waiter = self.waiter
            if (
                type(number) is int  # a host int (never an array's ==), the next one, with the same figures and calls
                and number - 1 == self._last
                and examples is self._examples
                and tokens is self._tokens
                and model_flops is self._model_flops
                and (calls is self._programs or calls == self._programs)  # a tuple of programs (compared by identity)
                and handed < self._due  # a step held once a look's time of the host's: a loop that ends or pauses
                and not waiter.want  # leaves at most that much of its steps to estimate; and one that paused within
                and handed - previous < waiter.resumed_after  # a long look says so when it resumes
                and len(self._handed) + waiter.taken < self._max_pending
            ):
                self._last = self.dispatched = number  # one object: the one they drop is one (a cold one, freed)
                self._last_ready = ready
                self._handed.append(handed)
                modulus = self._modulus  # the sampler's check inlined: a call only where a trace may start or stop
                if modulus and (
                    (number + LEAD) % modulus == 0 or number == self._watch or self._blocks.retry is not None
                ):
                    self._sampled(number)
                return
            self._step(handed, previous, number, ready, examples, tokens, model_flops, calls)
        except Exception as exc:  # never into training
            log.warning("jaxmon.step failed; the step is not tracked", error=f"{type(exc).__name__}: {exc}")

    def called(self, program: Program) -> None:
        """A tracked function ran `program` once in the current step (the training thread: jaxmon.track()'s wrapper
        inlines the first call's case)."""
        calls = self.calls
        self.calls = program.once if calls is NO_CALLS else (*calls, program)

    def _step(
        self, handed: float, previous: float, number: Any, ready: tuple[Any, ...], examples: Any, tokens: Any,
        model_flops: Any, calls: tuple[Program, ...],
    ) -> None:  # fmt: skip
        """step()'s slower path: the step the waiter asked for (jaxmon's own handles on its ready arrays), one whose
        number or figures are JAX arrays (handles on them, read by the waiter once the step is done), or one that
        does not follow on from the step before."""
        if self.owner is None:
            not_running("step", stacklevel=4)  # the caller of jaxmon.step(), through step() and this
            return
        self.stepping = True
        ops = self.ops
        waiter = self.waiter
        if handed - previous >= waiter.resumed_after:
            self._handed.append((handed, RESUMED, None, None, None, NO_CALLS, None))
        looked = waiter.want or handed >= self._due
        given = (number, examples, tokens, model_flops)
        plain = type(number) is int and type(examples) in PLAIN and type(tokens) in PLAIN and type(model_flops) in PLAIN
        if not plain:
            given = tuple(Held(ops.hold(v)) if ops.is_array(v) else v for v in given)  # type: ignore[assignment]
            looked = True  # its figures are read once it is done: the waiter waits for it
        host = type(number) is int or (isinstance(number, numbers.Integral) and not isinstance(number, bool))
        if host:
            self.dispatched = int(number)  # a host integer; a device one is set by the waiter
        self._last_ready = ready
        if len(self._handed) + waiter.taken >= self._max_pending:
            self._last = None  # the next step handed is a whole tuple: the waiter does not know this one
            self._problem("dropped", "training steps not tracked: the waiter is far behind", number=shown(number))
            return
        hold = None
        if looked:
            hold, self._due = self._hold(ready), handed + waiter.every
        if hold is None and plain and number - 1 == self._last and calls == self._programs and self._same(given):
            self._handed.append(handed)  # follows on: its figures equal the step before's (other objects)
        else:
            self._handed.append((handed, given[0], given[1], given[2], given[3], calls, hold))
        if plain:  # the step the next one may follow on from
            self._last, self._programs = self.dispatched, calls
            self._examples, self._tokens, self._model_flops = examples, tokens, model_flops
        else:
            self._last = None
        if looked and waiter.want:
            waiter.want = False
            waiter.wake()
        if host:
            self._sampled(int(number))  # a device step number starts no sampled trace (it is not read here)

    def _sampled(self, number: int) -> None:
        """Step `number` handed to the sampler, where a sampled trace may start or stop; its watch copied."""
        sampler = self.sampler
        sampler.handed(number)
        self._watch = sampler.watch

    def _same(self, given: tuple[Any, Any, Any, Any]) -> bool:
        """Whether a step's host figures equal the step before's (the same types: never an array's ==)."""
        _, examples, tokens, model_flops = given
        before = (self._examples, self._tokens, self._model_flops)
        return all(type(a) is type(b) and a == b for a, b in zip((examples, tokens, model_flops), before, strict=True))

    def _hold(self, ready: tuple[Any, ...]) -> Hold:
        """jaxmon's own handles on `ready`'s arrays (on the training thread, where nothing deletes them meanwhile),
        or a barrier's when it holds none; the names of the loss gauge's scalars where `ready` is a scalar or a dict
        of scalars."""
        ops = self.ops
        arrays = ops.arrays(ready)
        if not arrays:  # no ready, or a tree of host numbers: no array says when the step is done
            return Hold(ops.barrier())
        handles = [h for h in map(ops.hold, arrays) if h is not None]
        if len(handles) < len(arrays):
            return Hold(handles, lost=True)
        return Hold(handles, loss=loss_names(ready, arrays))

    def pause(self) -> None:
        """No step comes for a while (a badput() block opens, an epoch ends: on the training thread). The last step's
        arrays are held now (a mark), so that the steps before it are seen complete when they were, not after."""
        if not self._handed or held(self._handed[-1]):
            return  # nothing handed, or the last step is looked at already
        self._handed.append((self._clock(), MARK, None, None, None, NO_CALLS, self._hold(self._last_ready)))
        self.waiter.hurry()


def _ignore(*args: Any, **kwargs: Any) -> None:
    pass


# The process's hand: jaxmon.step is its bound method (jaxmon.training).
HAND = Hand()
