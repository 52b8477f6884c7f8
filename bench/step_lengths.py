"""What one `jaxmon.step()` call costs the training thread at every step length, from 0.3 ms to 10 s (issue 49: at
one step every 50 ms it took ~200 µs median and up to 4.6 ms, against 16 µs at 2 ms steps).

    .venv/bin/python bench/step_lengths.py                      # about 3 minutes on 2 cores
    .venv/bin/python bench/step_lengths.py --lengths 0.0003,0.05 --seconds 5
    .venv/bin/python bench/step_lengths.py --platform tpu       # on a TPU machine (no socket needed)

One process, jaxmon embedded (probe off). For each step length L, a loop of a small jitted step (its output handed
as `ready`, with Python figures) that waits for the step before last and sleeps what is left of L after its own work,
for `--seconds` (at least 3 steps): a loop paced at L by its host, the device mostly idle, every call of step() after a
wait, as the long-step case it is. Only the step() call is timed (perf_counter around it): the median, p99 and
maximum per length, beside Python's own call floor (a function of step()'s signature that does nothing, called right
before it: after a wait of tens of milliseconds a call's caches are cold, and the floor shows what that costs any
call), with the process's CPU time per step beside the wall time.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from common import save

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
ap.add_argument("--lengths", default="0.0003,0.001,0.005,0.02,0.05,0.2,1,10", help="step lengths, seconds")
ap.add_argument("--seconds", type=float, default=12.0, help="seconds of steps per length (10 s steps: 3 steps)")
ap.add_argument("--platform", default="cpu")
ap.add_argument("--name", default="step_lengths")
args = ap.parse_args()
if args.platform == "cpu":
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxmon  # noqa: E402


def nothing(n: int, *ready: Any, examples: Any = None, tokens: Any = None, model_flops: Any = None) -> None:
    """Python's own call floor: step()'s signature, no work."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(length: float, step: Any, x: Any) -> dict[str, Any]:
    steps = max(3, int(args.seconds / length))
    calls: list[float] = []
    floor: list[float] = []  # a function of step()'s signature that does nothing, called just before it
    pending: list[Any] = []
    cpu, wall = time.process_time(), time.perf_counter()
    for n in range(steps):
        began = time.perf_counter()
        x = step(x)
        start = time.perf_counter()
        nothing(n, x, examples=32, tokens=4096)
        floor.append(time.perf_counter() - start)
        start = time.perf_counter()
        jaxmon.step(n, x, examples=32, tokens=4096)
        calls.append(time.perf_counter() - start)
        pending.append(x)
        if len(pending) > 2:
            pending.pop(0).block_until_ready()
        rest = length - (time.perf_counter() - began)
        if rest > 0:
            time.sleep(rest)
    x.block_until_ready()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "length_s": length,
        "steps": steps,
        "step_us_median": percentile(calls, 0.5) * 1e6,
        "step_us_p99": percentile(calls, 0.99) * 1e6,
        "step_us_max": max(calls) * 1e6,
        "floor_us_median": percentile(floor, 0.5) * 1e6,
        "floor_us_p99": percentile(floor, 0.99) * 1e6,
        "cpu_ms_per_step": cpu / steps * 1e3,
        "wall_ms_per_step": wall / steps * 1e3,
    }


def main() -> None:
    exporter = jaxmon.start(workload="step-lengths", collector={"probe": {"enabled": False}})
    step = jax.jit(lambda v: jnp.tanh(v) * 1.0001)
    x = jnp.ones((256, 256))
    step(x).block_until_ready()
    results = []
    try:
        for length in (float(v) for v in args.lengths.split(",")):
            result = run(length, step, x)
            results.append(result)
            r = result
            print(
                f"{length * 1e3:9.1f} ms steps x{r['steps']:6d}: step() median {r['step_us_median']:7.1f} us,"
                f" p99 {r['step_us_p99']:7.1f}, max {r['step_us_max']:8.1f} (floor {r['floor_us_median']:.1f},"
                f" p99 {r['floor_us_p99']:.1f}); CPU {r['cpu_ms_per_step']:.3f} ms of {r['wall_ms_per_step']:.3f} ms",
                flush=True,
            )
    finally:
        exporter.stop()
    save(args.name, {"platform": args.platform, "devices": str(jax.devices()[0]), "results": results})


if __name__ == "__main__":
    main()
