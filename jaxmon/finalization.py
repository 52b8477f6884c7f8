"""Leaving JAX before the interpreter finalizes, so a workload always exits with its own status.

A daemon thread still inside JAX's C++ code (backend start-up, compiling or running the probe, memory_stats) while
the interpreter finalizes is torn down by a forced unwind that the C++ code may not let through: the process aborts
with `terminate called after throwing an instance of ''` / `FATAL: exception not rethrown` (exit 134) instead of
exiting with the script's status. jaxmon's threads in a workload process are therefore stopped and joined before
finalization begins.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  # its workers' join is registered first, so it runs after ours
import itertools
import os
import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger("jaxmon.finalization")

# How long the interpreter's exit waits for jaxmon's threads to leave JAX (a hung device call never returns).
EXIT_WAIT = 60.0

# The callbacks to run, by registration number: one function registered with the interpreter runs them all (the
# interpreter's own lists cannot be taken back from), so that a stopped exporter or publisher unregisters its
# callback and holds nothing for the rest of the process.
_callbacks: dict[int, Callable[[], None]] = {}
_numbers = itertools.count()
_lock = threading.Lock()
_installed = False
_ran = False


def before_finalization(callback: Callable[[], None]) -> Callable[[], None]:
    """Run `callback` when the interpreter exits, before daemon threads are abandoned; returns what unregisters it
    (call it when the callback's owner stops: the callback and what it holds are then let go).

    threading._register_atexit callbacks run in threading._shutdown, before the interpreter joins non-daemon
    threads and finalizes (concurrent.futures uses it to join its workers, Lib/concurrent/futures/thread.py);
    plain atexit callbacks run later. Fall back to atexit where it is missing or shutdown has begun. Callbacks run
    last registered first, as both do; one that raises is logged and the others still run.
    """
    global _installed
    with _lock:
        if _ran:  # the callbacks have run: the interpreter's own atexit still runs it
            atexit.register(callback)
            return lambda: atexit.unregister(callback)
        number = next(_numbers)
        _callbacks[number] = callback
        if not _installed:
            _installed = True
            register = getattr(threading, "_register_atexit", None)
            try:
                if register is None:
                    raise RuntimeError("no threading._register_atexit")
                register(_run_callbacks)
            except RuntimeError:
                atexit.register(_run_callbacks)

    def unregister() -> None:
        with _lock:
            _callbacks.pop(number, None)

    return unregister


def registered() -> int:
    """How many callbacks wait for the interpreter's exit (tests: a stopped owner leaves none behind)."""
    with _lock:
        return len(_callbacks)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # it may have been held by another thread at fork (the callbacks check their pid)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _run_callbacks() -> None:
    """Run the callbacks, last registered first, one at a time: one may unregister another (an exporter that stops
    lets go of the training tracker's), or register one (run in turn)."""
    global _ran
    while True:
        with _lock:
            if not _callbacks:
                _ran = True
                return
            callback = _callbacks.pop(max(_callbacks))
        try:
            callback()
        except Exception as exc:  # the others must still run: each lets its threads leave JAX
            log.error("exit callback failed", error=f"{type(exc).__name__}: {exc}")
