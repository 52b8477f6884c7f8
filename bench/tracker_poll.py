"""What a poll of the training tracker costs, and how long `jaxmon.step()` waits for it (issue 33).

    .venv/bin/python bench/tracker_poll.py            # about a minute on 2 cores

`Tracker.reading()` (every poll, every publish) holds the lock that `step()` takes. It used to rescan the whole MFU
window for every device in `Accounting.utilization()`; the window's sums are now kept as steps enter and leave it.
In one process, a tracker on 8 CPU devices with `window=100000` (peak set, so MFU and HFU are computed), its window
filled with 100 000 steps of FLOPs on every device, then, in alternating rounds (before, after, after, before, ...):

- `reading_ms`: `reading()` timed alone, back to back;
- `step_us`: `jaxmon.step(n, x)` on the training thread, 1 ms apart (an array already computed, model FLOPs given:
  the waiter books each step, so the window keeps moving) while another thread calls `reading()` every 10 ms
  (before, each poll takes longer than that: one is always in flight). Its median, p99 and max: a step() that lands
  on a poll waits for it.

"before" is this tree's tracker with `utilization()` replaced by the rescan it used to do (kept below, verbatim but
for its name), "after" the tracker as it is.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import argparse
import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from common import median, save
from jaxmon.training.accounting import Accounting

import jaxmon
from jaxmon import training
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.tracker import Tracker, TrackerConfig

WINDOW = 100_000
POLL_EVERY = 0.01  # 500 times jaxmon's default poll interval: one poll in flight at any moment before


def rescanned_utilization(
    acct: Accounting, peaks: Mapping[tuple[str, int], float]
) -> tuple[dict[tuple[str, int], float], ...]:
    """Accounting.utilization() before issue 33: the whole window, for every device, at every reading."""
    seconds = sum(s.counted for s in acct.recent)
    mfu: dict[tuple[str, int], float] = {}
    hfu: dict[tuple[str, int], float] = {}
    if seconds <= 0:
        return mfu, hfu
    for key, peak in peaks.items():
        model = sum(s.model_flops.get(key, 0.0) for s in acct.recent)
        hardware = sum(s.hardware_flops.get(key, 0.0) for s in acct.recent)
        if any(key in s.model_flops for s in acct.recent):
            mfu[key] = model / (seconds * peak)
        if any(key in s.hardware_flops for s in acct.recent):
            hfu[key] = hardware / (seconds * peak)
    return mfu, hfu


def filled_tracker(source: LocalSource, before: bool) -> Tracker:
    """A tracker whose window holds WINDOW steps of FLOPs on every device."""
    tracker = Tracker(JaxTraining(source), TrackerConfig(peak_flops=1e12, window=WINDOW))
    acct = tracker._acct
    keys = [d.key for d in tracker._devices]
    acct.first(acct.started, [])
    done = acct.started
    for _ in range(WINDOW):
        acct.step(done, done + 0.01, done, [], dict.fromkeys(keys, 1e9), dict.fromkeys(keys, 2e9))
        done += 0.01
    if before:
        acct.utilization = lambda peaks: rescanned_utilization(acct, peaks)  # type: ignore[method-assign]
    return tracker


def one_round(source: LocalSource, before: bool, readings: int, steps: int) -> dict[str, Any]:
    tracker = filled_tracker(source, before)
    training._tracker = tracker
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
        training._tracker = None
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
    rounds: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
            rounds[side].append(one_round(source, side == "before", args.readings, args.steps))
            print(side, rounds[side][-1], flush=True)
    figures = {side: {key: statistics.median(x[key] for x in rs) for key in rs[0]} for side, rs in rounds.items()}
    save("tracker_poll", {"window": WINDOW, "devices": 8, "figures": figures, "rounds": rounds})


if __name__ == "__main__":
    main()
