"""Training telemetry from inside the job: step time, throughput, MFU and goodput, with no device sync added.

    jaxmon.start(10401, workload="llama")            # or jaxmon.publish("/run/jaxmon", workload="llama")
    step_fn = jaxmon.track(jax.jit(train_step, donate_argnums=0))   # optional: XLA's FLOPs per call
    for n in range(first_step, last_step):
        state, loss = step_fn(state, batch)
        jaxmon.step(n, loss, examples=batch_size, tokens=batch_size * seq_len, model_flops=flops_per_step)
        if n % 1000 == 0:
            with jaxmon.badput("checkpoint"):
                save(state)

`step()` returns at once and never raises: a waiter thread of jaxmon's books the steps (docs/training.md, "How a step
is measured").
Without a running `jaxmon.start()` or `jaxmon.publish()` the three calls do nothing (one warning).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

import structlog

from jaxmon.finalization import EXIT_WAIT, before_finalization
from jaxmon.training.hand import HAND
from jaxmon.training.hand import not_running as _not_running

if TYPE_CHECKING:  # the tracker is imported when one starts (activate()): the step's side alone is loaded here
    from jaxmon.training.tracker import Program, Tracker, TrackerConfig, TrainingOps

log = structlog.get_logger("jaxmon.training")

P = ParamSpec("P")
R = TypeVar("R")

# The compiled programs (argument signatures) a tracked function keeps the cost of, least recently called first out:
# a function called with ever new shapes (dynamic-shape eval, variable sequence lengths) keeps memory bounded. One
# that falls out is counted (reason="programs"); called again, its cost is read again (one lowering, on the calling
# thread).
MAX_PROGRAMS = 256

_tracker: Tracker | None = None
_users = 0  # the running start()s and publish()es that hold _tracker
_unregister_exit: Callable[[], None] | None = None
_lock = threading.Lock()
# How long the release of a tracker (its last start() or publish() stopped) waits for its waiter to end: the waiter
# may be waiting for a step's arrays on a busy device, and stop() runs on the training thread.
RELEASE_WAIT = 1.0


def activate(ops: Callable[[], TrainingOps], config: TrackerConfig) -> Tracker:
    """The process's tracker, made on first use (jaxmon.start() and jaxmon.publish() call this; each `release()`s
    it when it stops).

    One tracker serves every running start() and publish() of the process (jaxmon.step() feeds one). Once the last
    of them has stopped, the next activate() makes a new tracker with its own options; while one runs, a call with
    other training options gets the running tracker and a warning saying which options stay."""
    global _tracker, _users, _unregister_exit
    with _lock:
        if _tracker is None:
            from jaxmon.training.tracker import Tracker

            _tracker = Tracker(ops(), config)
            tracker = _tracker
            # The waiter thread waits inside JAX: let it leave before the interpreter finalizes.
            _unregister_exit = before_finalization(lambda: tracker.stop(EXIT_WAIT))
        elif _tracker.config != config:
            log.warning(
                "jaxmon's training tracker already runs with other training options (jaxmon.start() and "
                "jaxmon.publish() share one): keeping them; stop the running one first to change them",
                running=str(_tracker.config),
                asked=str(config),
            )
        _users += 1
        return _tracker


def release(tracker: Tracker) -> None:
    """One start() or publish() holding `tracker` stopped. The last one stops it: jaxmon.step() does nothing until
    the next start() or publish() makes a new tracker; steps not seen complete by then are not counted, and
    `jaxmon.track()`ed functions note their calls to whichever tracker runs when they are called."""
    global _tracker, _users, _unregister_exit
    with _lock:
        if tracker is not _tracker:
            return  # released already (or a forked child's copy)
        _users -= 1
        if _users > 0:
            return
        _tracker, unregister, _unregister_exit = None, _unregister_exit, None
    if unregister is not None:
        unregister()
    tracker.stop(RELEASE_WAIT)
    alive = [thread for thread in tracker.threads() if thread.is_alive()]
    if alive:
        # Still inside JAX (the waiter waiting for a step's arrays, the sampler stopping JAX's profiler, an analysis):
        # the interpreter's exit waits for them (they hold the tracker, nothing of the stopped exporter or
        # publisher). A daemon thread that comes back from C++ while the interpreter finalizes is ended by a forced
        # unwind, which C++ code that catches everything turns into an abort of the whole process: seen on a TPU
        # v5e chip, 3 of 3 exits right after a stop() that left a sampled trace being stopped.
        before_finalization(lambda: _join(alive, EXIT_WAIT))


def _join(threads: list[threading.Thread], timeout: float) -> None:
    """Join `threads` within `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))


def current() -> Tracker | None:
    """The running tracker, None before start() or publish() (and after the last of them stopped)."""
    return _tracker


# jaxmon.step(n, *ready, examples=, tokens=, model_flops=): the process's hand's bound method, one Python call a step
# (hand.py); it does nothing (one warning) while no start() or publish() runs.
step = HAND.step


def not_running(what: str) -> None:
    """jaxmon.`what`() was called with no tracker running: said once, at the caller's line (hand.py)."""
    _not_running(what, stacklevel=4)


@contextlib.contextmanager
def badput(kind: str) -> Iterator[None]:
    """Time in this block is not training: `checkpoint`, `data`, `eval`, or a kind of your own."""
    tracker = _tracker
    if tracker is None:
        not_running("badput")
        yield
        return
    tracker.pause()  # the host stops stepping: the waiter sees the steps so far complete now, not at its next look
    interval = tracker.interval(str(kind), tracker.now())  # open: a step completing meanwhile is charged for it
    try:
        yield
    finally:
        tracker.close(interval)


class Tracked(Generic[P, R]):
    """A jitted function whose calls add XLA's per-device FLOPs (cost analysis, once per compiled program) to the
    step they run in. It compiles nothing itself: the cost is read right after the first call of each program, on
    the calling thread, so it lowers in the loop's own contexts (`with mesh:`, `use_mesh`, Flax's axis rules): one
    lowering (a cache hit for the compilation) on the training thread per program."""

    def __init__(self, fn: Callable[P, R]) -> None:
        self._fn = fn
        self._programs: OrderedDict[Hashable, Program] = OrderedDict()  # least recently called first
        self._only: Program | None = None  # while the function holds one compiled program: that one
        size = getattr(fn, "_cache_size", None)  # jit's count of its compiled programs (a C++ call, ~0.1 µs)
        self._size: Callable[[], int] | None = size if callable(size) else None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        out = self._fn(*args, **kwargs)
        tracker = _tracker
        if tracker is None:
            not_running("track")
            return out
        try:
            only, size = self._only, self._size
            if only is not None and size is not None and size() == 1:  # the one program known: the call ran it
                hand = tracker.hand  # Hand.called(), inlined for a step's first call
                if not hand.calls:
                    hand.calls = only.once
                else:
                    hand.called(only)
            else:
                tracker.called(self._program(tracker, args, kwargs))
        except Exception as exc:
            log.warning("jaxmon.track could not note a call", error=f"{type(exc).__name__}: {exc}")
        return out

    def _program(self, tracker: Tracker, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Program:
        # One compiled program and one known: the call ran it (no signature to compute on the training thread).
        ops = tracker.ops
        size = ops.cache_size(self._fn)
        if self._only is not None and size == 1:
            return self._only
        key = ops.signature(args, kwargs)  # after the call: donated arguments keep their shapes and shardings
        program = self._programs.get(key)
        if program is None:  # a new program: its cost is read here, in the caller's contexts (mesh, axis rules)
            program = self._programs[key] = tracker.measure(self._fn, args, kwargs)
            if len(self._programs) > MAX_PROGRAMS:
                self._programs.popitem(last=False)
                tracker.forgot_program()
        else:
            self._programs.move_to_end(key)
        self._only = program if len(self._programs) == 1 and size == 1 else None
        return program

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)  # lower, trace, eval_shape... of the jitted function


def track(fn: Callable[P, R]) -> Tracked[P, R]:
    """Wrap a jitted function so that each call adds its XLA FLOPs (per device) to the current step."""
    return Tracked(fn)


def _after_fork_in_child() -> None:
    """A forked child has no waiter thread: it tracks nothing unless it calls start() or publish() itself."""
    global _tracker, _lock, _users, _unregister_exit
    _tracker, _users, _unregister_exit = None, 0, None
    _lock = threading.Lock()
    HAND.disarm()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["Tracked", "activate", "badput", "current", "release", "step", "track"]
