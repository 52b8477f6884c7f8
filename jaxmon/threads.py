"""jaxmon's own threads: the prefix every one of their names starts with, and the probe's workers' names.

A leaf module (it imports nothing of jaxmon), so that any room can name its threads and tell jaxmon's from the
user's (a jax.monitoring event of a jaxmon thread is no training time) without importing up.
"""

from __future__ import annotations

import threading

PREFIX = "jaxmon-"
# The probe's workers, `PROBE` + the device's name: JAX work on them (compilations, cache lookups, monitoring events)
# is jaxmon's own, never the workload's.
PROBE = PREFIX + "probe-"


def on_probe_thread() -> bool:
    """Whether the calling thread is one of the probe's workers (the listeners that count the workload's
    compilations and badput leave their events out)."""
    return threading.current_thread().name.startswith(PROBE)
