"""What a crash now would lose: the step and the time of the process's last checkpoint, and `jaxmon.checkpointed()`.

Orbax (orbax-checkpoint 0.12) records a jax.monitoring event when a save starts (`/jax/orbax/write/start`, or
`/jax/orbax/write/async/start` for an async save) and one when the whole save completed (`/jax/orbax/write/success`,
after an async save's background commit), on its primary host only, and names neither the step nor the path. So a
save's step is the number the loop last handed to `jaxmon.step()` when the save started (a loop saves the state its
last step made), and its time is that start (the state a restore brings back), both taken once the save completed:
a save that fails, or that a crash interrupts, is no checkpoint. Saves complete in the order they started (a
CheckpointManager finishes one before it starts the next). Other checkpointers say it themselves:
`jaxmon.checkpointed(step)` once the save is durable. jaxmon.sources.local.orbax_saves listens for Orbax's events;
this module holds what they said and is read by the checkpoint collector and the publisher (no JAX here: the spool's
daemon reads `CheckpointReading` too).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# Orbax's events as a save or a restore starts, by the badput kind the training tracker books it as (its interval
# starts there where that is earlier than the duration recorded as it ended says).
ORBAX_STARTS = {
    "/jax/orbax/write/start": "checkpoint",
    "/jax/orbax/write/async/start": "checkpoint",
    "/jax/orbax/read/start": "restore",
    "/jax/orbax/read/async/start": "restore",
}
START_EVENTS = frozenset(event for event, kind in ORBAX_STARTS.items() if kind == "checkpoint")  # saves
SUCCESS_EVENT = "/jax/orbax/write/success"
# Saves started and not completed that are remembered: a checkpointer whose saves never complete must not grow it.
MAX_PENDING = 64


@dataclass(frozen=True)
class CheckpointReading:
    """The process's last checkpoint (None: none completed yet, or its step is not known) and the interval the job
    declared (collector.checkpoint.interval and .interval_steps; None: not declared)."""

    step: int | None = None
    time: float | None = None  # Unix time of the state it holds
    interval_seconds: float | None = None
    interval_steps: int | None = None


class Checkpoints:
    """The process's checkpoints: Orbax's saves as they start and complete, and the calls of other checkpointers."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: deque[tuple[int | None, float]] = deque(maxlen=MAX_PENDING)
        self._step: int | None = None
        self._time: float | None = None

    def started(self, step: int | None) -> None:
        """A save started now, of the state after step `step` (None: no step handed yet)."""
        with self._lock:
            self._pending.append((step, self._clock()))

    def completed(self) -> None:
        """The oldest save started has completed."""
        with self._lock:
            if self._pending:
                step, when = self._pending.popleft()
                self._record(step, when)

    def checkpointed(self, step: int, when: float | None = None) -> None:
        """A checkpoint of the state after step `step`, taken at Unix time `when` (default now), is durable."""
        with self._lock:
            self._record(int(step), self._clock() if when is None else float(when))

    def _record(self, step: int | None, when: float) -> None:
        if self._time is not None and when < self._time:
            return  # an older checkpoint than the one known (a call about an earlier save)
        self._step = step if step is not None else self._step
        self._time = when

    def reading(self, interval_seconds: float | None = None, interval_steps: int | None = None) -> CheckpointReading:
        """The last checkpoint, with the interval the job declared."""
        with self._lock:
            return CheckpointReading(self._step, self._time, interval_seconds, interval_steps)


# The process's.
PROGRESS = Checkpoints()


def checkpointed(step: int, time: float | None = None) -> None:
    """Tell jaxmon that a checkpoint of the state after step `step` is durable (for checkpointers other than Orbax,
    whose saves jaxmon sees itself): `time` is the Unix time the state was taken (default: now). It is exported as
    jaxmon_training_last_checkpoint_step and _timestamp_seconds, and never raises."""
    try:
        PROGRESS.checkpointed(step, time)
    except (TypeError, ValueError) as exc:  # never into the training code
        import structlog

        structlog.get_logger("jaxmon.checkpoints").warning(
            "jaxmon.checkpointed: not a step number and a time", error=str(exc), step=repr(step)
        )
