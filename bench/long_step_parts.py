"""What each part of step()'s held path costs the training thread after a long wait (issue 49: step() at one step
every 50 ms and longer took 81-159 µs median on the TPU v5e chip, against 4.5-5.3 µs at 16 ms and shorter).

    .venv/bin/python bench/long_step_parts.py                         # CPU devices, about 30 s
    .venv/bin/python bench/long_step_parts.py --platform tpu          # on a TPU machine (no socket needed)

For each gap G (the host idle between steps, as a loop of long steps is), `--rounds` rounds of: sleep G, then time one
part alone (perf_counter around it). The parts are those of a held step (jaxmon/training/hand.py's `_held` and
`_hold`, the tracker's JaxTraining ops): a plain function call (the floor), `is_deleted()` and `sharding` of the
step's output, its `clone()`, a readiness check of the clone (step()'s check of the hold the waiter waits for), the
waiter's wake (a lock's release that a thread blocked on it takes), a release nobody waits on, a deque append, and
the whole `jaxmon.step()` with its output as `ready`. Each part is timed in rounds of its own, so that one part's
cold caches are not another's.
"""

from __future__ import annotations

import _thread
import argparse
import collections
import os
import statistics
import threading
import time
from typing import Any

from common import save

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
ap.add_argument("--gaps", default="0.001,0.016,0.05,0.2", help="the host's idle time before each timed part, seconds")
ap.add_argument("--rounds", type=int, default=25)
ap.add_argument("--platform", default="cpu")
ap.add_argument("--name", default="long_step_parts")
args = ap.parse_args()
if args.platform == "cpu":
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxmon  # noqa: E402


def nothing() -> None:
    """The floor: a call that does nothing."""


class Blocked:
    """A thread blocked on a lock, as the waiter is on its Signal; `release()` wakes it, and it blocks again."""

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.woken = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            self.lock.acquire()
            self.woken.set()

    def stop(self) -> None:
        self.stopping = True
        self.lock.release()


def main() -> None:
    device = jax.devices(args.platform)[0]
    step = jax.jit(lambda x: x * 1.0001)
    x = jax.device_put(jnp.ones(1 << 20, jnp.float32), device)
    out = step(x)
    out.block_until_ready()
    clone = out.clone()
    blocked = Blocked()
    free = _thread.allocate_lock()
    handed: collections.deque[Any] = collections.deque()

    def wake() -> None:
        blocked.lock.release()

    def release_free() -> None:
        free.acquire(blocking=False)
        free.release()

    parts: dict[str, Any] = {
        "floor": nothing,
        "is_deleted": lambda: out.is_deleted(),
        "sharding": lambda: out.sharding,
        "clone": lambda: out.clone(),
        "clone is_ready": lambda: clone.is_ready(),
        "wake a blocked thread": wake,
        "release, nobody waiting": release_free,
        "deque append": lambda: handed.append(1.0),
    }
    results: dict[str, dict[str, float]] = {}
    for gap in (float(g) for g in args.gaps.split(",")):
        for name, part in parts.items():
            times = []
            for _ in range(args.rounds):
                time.sleep(gap)
                blocked.woken.clear()
                start = time.perf_counter()
                part()
                times.append((time.perf_counter() - start) * 1e6)
                if name == "wake a blocked thread":
                    blocked.woken.wait(1)
                handed.clear()
            key = f"{gap * 1e3:g} ms: {name}"
            results[key] = {"median_us": statistics.median(times), "max_us": max(times)}
            print(f"{key:40s} median {statistics.median(times):8.1f} us, max {max(times):8.1f}", flush=True)
    blocked.stop()
    # The whole step() in a tracker, the loop paced at each gap (each step held: the waiter asks at every look).
    from jaxmon.sources.local import LocalSource
    from jaxmon.sources.local.training import JaxTraining
    from jaxmon.training.handed import TrackerConfig
    from jaxmon.training.tracker import Tracker

    tracked = Tracker(JaxTraining(LocalSource()), TrackerConfig())  # armed: jaxmon.step() is its (no HTTP)
    try:
        n = 0
        for gap in (float(g) for g in args.gaps.split(",")):
            times = []
            for _ in range(args.rounds):
                time.sleep(gap)
                y = step(x)
                start = time.perf_counter()
                jaxmon.step(n, y)
                times.append((time.perf_counter() - start) * 1e6)
                n += 1
            key = f"{gap * 1e3:g} ms: jaxmon.step()"
            results[key] = {"median_us": statistics.median(times), "max_us": max(times)}
            print(f"{key:40s} median {statistics.median(times):8.1f} us, max {max(times):8.1f}", flush=True)
    finally:
        tracked.stop(10)
    save(args.name, {"gaps": args.gaps, "rounds": args.rounds, "platform": args.platform, "results": results})


main()
