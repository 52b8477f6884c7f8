"""Leaving JAX before the interpreter finalizes, so a workload always exits with its own status.

A daemon thread still inside JAX's C++ code (backend start-up, compiling or running the probe, memory_stats) while
the interpreter finalizes is torn down by a forced unwind that the C++ code may not let through: the process aborts
with `terminate called after throwing an instance of ''` / `FATAL: exception not rethrown` (exit 134) instead of
exiting with the script's status. jaxmon's threads in a workload process are therefore stopped and joined before
finalization begins.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

# How long the interpreter's exit waits for jaxmon's threads to leave JAX (a hung device call never returns).
EXIT_WAIT = 60.0


def before_finalization(callback: Callable[[], None]) -> None:
    """Run `callback` when the interpreter exits, before daemon threads are abandoned.

    threading._register_atexit callbacks run in threading._shutdown, before the interpreter joins non-daemon
    threads and finalizes (concurrent.futures uses it to join its workers, Lib/concurrent/futures/thread.py);
    plain atexit callbacks run later. Fall back to atexit where it is missing or shutdown has begun.
    """
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(callback)
    except RuntimeError:
        atexit.register(callback)
