"""The names of jaxmon's threads: each one jaxmon starts is named `PREFIX` + what it does (`jaxmon-training`,
`jaxmon-http`, ...), so a thread list, a profile or `py-spy dump` says which threads are jaxmon's.

The probe's workers are named `PROBE` + the device: JAX work on them (compilations, cache lookups, monitoring
events) is jaxmon's own, never the workload's, and the listeners that count the workload's leave it out
(`on_probe_thread()`). A leaf: it imports no other jaxmon module.
"""

from __future__ import annotations

import threading

PREFIX = "jaxmon-"
PROBE = PREFIX + "probe-"


def on_probe_thread() -> bool:
    """Whether the calling thread is one of the probe's workers."""
    return threading.current_thread().name.startswith(PROBE)
