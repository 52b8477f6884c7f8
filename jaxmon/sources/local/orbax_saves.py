"""Orbax's saves as jax.monitoring reports them (jaxmon.checkpoints): one listener per process, installed on first
use by the workload's view of itself."""

from __future__ import annotations

import threading

from jaxmon.checkpoints import PROGRESS, START_EVENTS, SUCCESS_EVENT, Checkpoints

_installed = False
_lock = threading.Lock()


def _dispatched() -> int | None:
    """The step number the loop last handed to jaxmon.step() (None without a tracker or a step)."""
    from jaxmon.training import current

    tracker = current()
    return None if tracker is None else tracker.dispatched


def listen(progress: Checkpoints = PROGRESS) -> Checkpoints:
    """The process's checkpoints, Orbax's events feeding them (registered once)."""
    global _installed
    with _lock:
        if not _installed:
            from jax import monitoring

            def on_event(event: str, **_: object) -> None:
                if event in START_EVENTS:
                    progress.started(_dispatched())
                elif event == SUCCESS_EVENT:
                    progress.completed()

            monitoring.register_event_listener(on_event)
            _installed = True
    return progress
