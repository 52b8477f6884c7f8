"""The terms of the training tracker's sampled traces that others hold it to: how many steps before its block a
trace starts (`LEAD`, which the training collector's options check `every` against), the bounds of a trace on
demand (`/debug/trace`), and `Busy`, which the profiler raises when the user is profiling. Outside the training wing
(jaxmon.training.sampler), so that the daemon's web server and settings load none of it."""

from __future__ import annotations

# The trace starts when step n0 - LEAD is handed at the latest: step n0 - 1 may be dispatched right after, and its
# completion (the start of n0's window) must come after the trace started. A profiler slow to start makes the sampler
# ask that many steps' time earlier (its `lead`, up to every - steps).
LEAD = 2
# On demand (/debug/trace): at most this many steps and seconds; a request waits this long for the steps at most.
MAX_DEMAND_STEPS, MAX_DEMAND_SECONDS, DEMAND_STEP_TIMEOUT = 100, 60.0, 300.0


class Busy(Exception):
    """The user (or another tool) is profiling: jaxmon takes no trace now, or ended its own to let the user's run."""
