"""A loop that runs an epoch ahead of its device, then waits for the last step and opens a block (Keras's shape),
with jaxmon.step() on each step: jaxmon's step durations against the loop's own completions.

    python bench/run_ahead.py [--epochs 3] [--steps 24] [--rounds 3] [--out results.json]

On a TPU or GPU the step is a bf16 matmul chain of a few milliseconds; on CPU devices a float32 one. The truth: the
first timed step's completion, seen by a thread of its own waiting on its output (as Keras's callbacks see a step's
logs), and each epoch's last, which the loop waits for. Prints and writes, per round, jaxmon's summed durations from
the first timed step's completion, the loop's, their difference, and the shortest step jaxmon booked against the
device's own step time (a step timed alone, waited for).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp

import jaxmon
from jaxmon import training

WARM = 3  # steps each waited for before the timed epochs (Keras's first steps: compiled, waited for)


def make_step(platform: str) -> tuple[Any, Any]:
    """A jitted step of a few milliseconds on `platform`'s first device, and its input."""
    if platform == "cpu":
        size, repeat, dtype = 384, 10, jnp.float32
    else:
        size, repeat, dtype = 4096, 8, jnp.bfloat16

    @jax.jit
    def step(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, repeat, lambda _, c: jnp.tanh(c @ c) / size, x)

    return step, jnp.ones((size, size), dtype)


def one_round(step: Any, x: jax.Array, epochs: int, steps: int) -> dict[str, Any]:
    tracker = training.current()
    assert tracker is not None
    before = tracker.reading()
    base_count = before.duration_count if before is not None else 0
    steps_before = before.steps_total if before is not None else 0
    n = steps_before
    for _ in range(WARM):
        x = step(x)
        jaxmon.step(n, x)
        x.block_until_ready()
        n += 1
    tracker.flush(10)
    warm = tracker.reading()
    assert warm is not None
    seen: list[float] = []
    watcher = None
    for _ in range(epochs):
        for _k in range(steps):
            x = step(x)
            jaxmon.step(n, x)
            if watcher is None:
                watcher = threading.Thread(target=lambda y=x: (y.block_until_ready(), seen.append(time.monotonic())))
                watcher.start()
            n += 1
        x.block_until_ready()
        seen.append(time.monotonic())
        with jaxmon.badput("eval"):
            time.sleep(0.02)
    assert watcher is not None
    watcher.join()
    tracker.flush(30)
    end = tracker.reading()
    assert end is not None and end.steps_total == n
    with tracker._lock:  # the window's steps: (counted seconds, busy part, observed, ...)
        counted = [s[0] for s in tracker._ledger.window_steps()][-(epochs * steps) :]
    jaxmon_sum = end.duration_sum - warm.duration_sum - counted[0]  # from the first timed step's completion
    truth = seen[-1] - seen[0]
    return {
        "steps": epochs * steps,
        "durations_counted": end.duration_count - base_count,
        "jaxmon_seconds": jaxmon_sum,
        "loop_seconds": truth,
        "difference_seconds": jaxmon_sum - truth,
        "shortest_booked_seconds": min(counted[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    platform = jax.devices()[0].platform
    step, x = make_step(platform)
    x = step(x).block_until_ready()
    t = time.monotonic()
    step(x).block_until_ready()
    alone = time.monotonic() - t
    jaxmon.start(0, workload="run-ahead", collector={"probe": {"enabled": False}})
    rounds = [one_round(step, x, args.epochs, args.steps) for _ in range(args.rounds)]
    out = {
        "platform": platform,
        "device_kind": jax.devices()[0].device_kind,
        "step_alone_seconds": alone,
        "rounds": rounds,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    jaxmon.stop()


if __name__ == "__main__":
    main()
