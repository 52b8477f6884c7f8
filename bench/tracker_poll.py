"""What a poll of the training tracker costs, and how long `jaxmon.step()` waits for it (issue 33; the ledger of
issue 49).

    .venv/bin/python bench/tracker_poll.py            # about a minute on 2 cores

`Tracker.reading()` (every poll, every publish) reads the window's MFU and HFU. Issue 33 made that O(devices), not
O(window): the window's sums were kept as steps entered and left it. The ledger of issue 49 keeps the window in
ring buffers and reads it with NumPy at each reading. In one process, a tracker on 8 CPU devices (peak set, so MFU and
HFU are computed), its window filled with steps of FLOPs on every device, at two windows side by side in alternating
rounds (the default 100 and 100 000):

- `reading_ms`: `reading()` timed alone, back to back;
- `step_us`: `jaxmon.step(n, x)` on the training thread, 1 ms apart (an array already computed, model FLOPs given:
  the waiter books each step, so the window keeps moving) while another thread calls `reading()` every 10 ms. Its
  median, p99 and max: a step() never waits for a poll (the ledger is the waiter's and the poll's, not step()'s).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import argparse
import statistics
import threading
import time
from typing import Any

import jax.numpy as jnp
from common import median, save

import jaxmon
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.tracker import Tracker, TrackerConfig

WINDOWS = (100, 100_000)
POLL_EVERY = 0.01  # 500 times jaxmon's default poll interval


def filled_tracker(source: LocalSource, window: int) -> Tracker:
    """A tracker whose window holds `window` steps of FLOPs on every device."""
    tracker = Tracker(JaxTraining(source), TrackerConfig(peak_flops=1e12, window=window))
    ledger = tracker._ledger
    keys = [device.key for device in ledger._devices]
    ledger.first(ledger.started, [])
    done = [ledger.started + 0.01 * (k + 1) for k in range(window)]
    ledger.run(ledger.started, done, done, (), dict.fromkeys(keys, 1e9), dict.fromkeys(keys, 2e9))
    return tracker


def one_round(source: LocalSource, window: int, readings: int, steps: int) -> dict[str, Any]:
    tracker = filled_tracker(source, window)
    x = jnp.ones(4).block_until_ready()
    try:
        jaxmon.step(0, x)  # from here on reading() computes (None before the first step())
        reading_s = []
        for _ in range(readings):
            t0 = time.perf_counter()
            tracker.reading()
            reading_s.append(time.perf_counter() - t0)
        stop = threading.Event()
        polls = 0

        def poll() -> None:
            nonlocal polls
            while not stop.wait(POLL_EVERY):
                tracker.reading()
                polls += 1

        poller = threading.Thread(target=poll)
        poller.start()
        step_s = []
        for n in range(1, steps + 1):
            t0 = time.perf_counter()
            jaxmon.step(n, x, model_flops=8e9)
            step_s.append(time.perf_counter() - t0)
            time.sleep(0.001)
        stop.set()
        poller.join()
    finally:
        tracker.stop(10)
    step_s.sort()
    return {
        "reading_ms": median(reading_s) * 1e3,
        "step_us_median": median(step_s) * 1e6,
        "step_us_p99": step_s[int(0.99 * (len(step_s) - 1))] * 1e6,
        "step_us_max": step_s[-1] * 1e6,
        "polls_during_steps": polls,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per side")
    ap.add_argument("--readings", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    source = LocalSource(sidecar_defaults=False)
    rounds: dict[str, list[dict[str, Any]]] = {str(w): [] for w in WINDOWS}
    for r in range(args.rounds):
        for window in WINDOWS if r % 2 == 0 else WINDOWS[::-1]:
            rounds[str(window)].append(one_round(source, window, args.readings, args.steps))
            print(window, rounds[str(window)][-1], flush=True)
    figures = {side: {key: statistics.median(x[key] for x in rs) for key in rs[0]} for side, rs in rounds.items()}
    save("tracker_poll", {"windows": list(WINDOWS), "devices": 8, "figures": figures, "rounds": rounds})
    print(figures)


if __name__ == "__main__":
    main()
