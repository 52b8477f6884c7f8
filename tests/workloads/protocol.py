"""What the workload children (run by tests.helpers.Child, which puts the checkout on their PYTHONPATH) share: the
answer line the test reads (`OK <json>`), and the wait for jaxmon's waiter to book a step."""

from __future__ import annotations

import json
import time


def answer(**fields: object) -> None:
    """One answer to the test's command, on stdout."""
    print("OK " + json.dumps(fields), flush=True)


def booked(number: int) -> None:
    """Wait (up to 10 s) until jaxmon's waiter thread has booked step `number` as complete.

    The loop saw it complete; the waiter sees it a little later, later still on a loaded machine (4 ms seen beside
    two CPU burners). Time the loop spends in between (a data block, a checkpoint) overlaps what jaxmon books as the
    step's device time, so it is rightly no badput, but the loop cannot time that instant. Waiting keeps the loop's
    own timings an exact truth for the exported step times and badput.
    """
    import jaxmon.training  # here: a child sets JAX's environment before it imports jaxmon

    tracker = jaxmon.training.current()
    deadline = time.monotonic() + 10
    while tracker is not None and time.monotonic() < deadline:
        reading = tracker.reading()
        if reading is not None and reading.step is not None and reading.step >= number:
            return
        time.sleep(0.001)
