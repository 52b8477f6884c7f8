"""jaxmon's own threads: the prefix every one of their names starts with, the probe's workers' names, and one
stoppable worker.

A leaf module (it imports nothing of jaxmon), so that any room can name its threads and tell jaxmon's from the
user's (a jax.monitoring event of a jaxmon thread is no training time) without importing up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PREFIX = "jaxmon-"
# The probe's workers, `PROBE` + the device's name: JAX work on them (compilations, cache lookups, monitoring events)
# is jaxmon's own, never the workload's.
PROBE = PREFIX + "probe-"


def on_jaxmon_thread() -> bool:
    """Whether the calling thread is one of jaxmon's (its JAX work, the probe's compilations, is no training time)."""
    return threading.current_thread().name.startswith(PREFIX)


def as_jaxmon(name: str, call: Callable[[], T]) -> T:
    """`call()` on a jaxmon thread (`PREFIX + name`), waited for: its result, or what it raised. Its JAX work
    (compilations, monitoring events) is then jaxmon's own, whichever thread asked for it."""
    out: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the caller
            raised.append(exc)

    thread = threading.Thread(target=run, name=PREFIX + name, daemon=True)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]
    return out[0]


class Worker:
    """A daemon thread named `PREFIX + name` that runs `body()` once (a loop that checks `stopping`), and a stop
    that wakes it (`wake`: what makes its own waits return, e.g. a Condition's notify) and waits for it a while.

    A hung body (a device that never completes) does not hold the interpreter's exit: the thread is a daemon."""

    def __init__(self, name: str, body: Callable[[], None], wake: Callable[[], None] | None = None) -> None:
        self._stop = threading.Event()
        self._wake = wake
        self.thread = threading.Thread(target=body, name=PREFIX + name, daemon=True)

    def start(self) -> Worker:
        """Start the thread (the caller's thread waits for it to run: never call this on the training thread's
        hot path)."""
        self.thread.start()
        return self

    @property
    def stopping(self) -> bool:
        """stop() was called."""
        return self._stop.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep `seconds`, or until stop(); whether to go on (False once stopping)."""
        return not self._stop.wait(seconds)

    def stop(self, timeout: float) -> None:
        """Ask the body to end, wake it, and wait up to `timeout` for it (not when called from the thread itself)."""
        self._stop.set()
        if self._wake is not None:
            self._wake()
        if self.thread is not threading.current_thread() and self.thread.ident is not None:
            self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
