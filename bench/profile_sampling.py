"""The cost of sampled traces (collector.training.profile) to a training loop, on the 8 CPU devices.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python bench/profile_sampling.py      # a few minutes

The loop: a 4-layer MLP (1024 wide, batch 256) under Mesh(("data", "model"), (4, 2)), batch sharded over `data`,
weights replicated (their gradients all-reduced over `data`), at most two steps in flight (the docs' loops), each
handed to jaxmon's real tracker (`Tracker.step`, as `jaxmon.step()` does).

1. One sample, piece by piece (--samples times): jaxmon's session start and stop (JaxProfiler), the parse and split
   (`jaxmon.xla.profile.read`, `Trace.split`) of its 2 steps, and the traced steps' time against the untraced ones'.
2. The training thread while a sample is parsed: the loop's median step with a thread parsing that trace over and
   over (as the sampler's thread does once per sample), against without, alternating blocks.
3. Throughput: alternating runs of --steps steps with sampling on (every --every steps, 2 steps each) and off, in one
   process; the cost per sample in steps of training lost, and from it the cost at the default interval
   (PROFILE_EVERY) and the smallest interval that keeps it under 0.5 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmon.collectors.training import PROFILE_EVERY
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.profiler import JaxProfiler
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.handed import SamplerConfig
from jaxmon.training.tracker import Tracker, TrackerConfig
from jaxmon.xla.profile import read

RESULTS = Path(os.environ.get("JAXMON_BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


def make_loop() -> tuple[Any, list[jax.Array], jax.Array]:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    layers = [jax.device_put(jnp.full((1024, 1024), 0.001), NamedSharding(mesh, P())) for _ in range(4)]
    x = jax.device_put(jnp.ones((256, 1024)), NamedSharding(mesh, P("data")))

    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    @jax.jit
    def step(ws: list[jax.Array], x: jax.Array) -> tuple[list[jax.Array], jax.Array]:
        value, grads = jax.value_and_grad(loss)(ws, x)
        return [w - 1e-3 * g for w, g in zip(ws, grads, strict=True)], value

    layers, value = step(layers, x)
    value.block_until_ready()
    return step, layers, x


class Loop:
    def __init__(self) -> None:
        self.step, self.layers, self.x = make_loop()
        self.number = 0

    def run(self, steps: int, tracker: Tracker | None = None, sync: bool = False) -> list[float]:
        """`steps` steps, at most two in flight (each synced when `sync`); each step's time as the loop sees it."""
        times: list[float] = []
        previous = None
        last = time.perf_counter()
        for _ in range(steps):
            self.layers, value = self.step(self.layers, self.x)
            if tracker is not None:
                tracker.step(self.number, value)
            self.number += 1
            if sync:
                value.block_until_ready()
            elif previous is not None:
                previous.block_until_ready()
            previous = value
            now = time.perf_counter()
            times.append(now - last)
            last = now
        if previous is not None:
            previous.block_until_ready()
        return times


def one_sample(loop: Loop, samples: int) -> dict[str, Any]:
    profiler = JaxProfiler(jax)
    start, stop, parse, traced, untraced, sizes = [], [], [], [], [], []
    data = b""
    for _ in range(samples):
        untraced += loop.run(4, sync=True)[1:]
        t0 = time.perf_counter()
        profiler.start(python=False)
        t1 = time.perf_counter()
        traced += loop.run(2, sync=True)
        t2 = time.perf_counter()
        data = profiler.stop()
        t3 = time.perf_counter()
        trace = read(data)
        lo, hi = trace.extent_ns()
        trace.split(lo, hi)
        t4 = time.perf_counter()
        start.append(t1 - t0)
        stop.append(t3 - t2)
        parse.append(t4 - t3)
        sizes.append(len(data))
    return {
        "start_s": statistics.median(start),
        "stop_s": statistics.median(stop),
        "parse_s": statistics.median(parse),
        "trace_bytes": statistics.median(sizes),
        "traced_step_s": statistics.median(traced),
        "untraced_step_s": statistics.median(untraced),
        "_data": data,
    }


def during_parse(loop: Loop, data: bytes, blocks: int, steps: int) -> dict[str, float]:
    """The loop's median step with and without a thread parsing `data` over and over, alternating blocks."""
    on: list[float] = []
    off: list[float] = []
    for _ in range(blocks):
        off += loop.run(steps, sync=True)[1:]
        done = threading.Event()

        def parse(done: threading.Event = done) -> None:
            while not done.is_set():
                trace = read(data)
                trace.split(*trace.extent_ns())

        thread = threading.Thread(target=parse)
        thread.start()
        on += loop.run(steps, sync=True)[1:]
        done.set()
        thread.join()
    return {"step_s_while_parsing": statistics.median(on), "step_s_without": statistics.median(off)}


def throughput(loop: Loop, every: int, steps: int, rounds: int) -> dict[str, Any]:
    """Alternating runs with sampling on and off; seconds per step of each run."""
    source = LocalSource(sidecar_defaults=False)
    per_step: dict[str, list[float]] = {"on": [], "off": []}
    taken = 0
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            tracker = Tracker(
                JaxTraining(source), TrackerConfig(profile=SamplerConfig(every if mode == "on" else 0, 2))
            )
            loop.number = 1  # blocks at the multiples of `every`, from the run's start
            loop.run(3, tracker)  # warm: the waiter and the sampler's thread start
            t0 = time.perf_counter()
            loop.run(steps, tracker)
            per_step[mode].append((time.perf_counter() - t0) / steps)
            reading = tracker.sampler.reading()
            taken += reading.results["taken"] if reading is not None else 0
            tracker.stop(10)
    on, off = statistics.median(per_step["on"]), statistics.median(per_step["off"])
    cost = (on - off) / off
    per_sample_steps = cost * every  # training lost per sample, in steps
    return {
        "every": every,
        "steps_per_run": steps,
        "rounds": rounds,
        "samples_taken": taken,
        "step_s_on": on,
        "step_s_off": off,
        "runs_on": per_step["on"],
        "runs_off": per_step["off"],
        "cost_at_every": cost,
        "cost_per_sample_steps": per_sample_steps,
        "default_every": PROFILE_EVERY,
        "cost_at_default": per_sample_steps / PROFILE_EVERY,
        "every_for_half_percent": per_sample_steps / 0.005,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    loop = Loop()
    loop.run(5)
    sample = one_sample(loop, args.samples)
    data = sample.pop("_data")
    result = {
        "one_sample": sample,
        "during_parse": during_parse(loop, data, 4, 10),
        "throughput": throughput(loop, args.every, args.steps, args.rounds),
        "load_average": os.getloadavg(),
        "cores": os.cpu_count(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "profile_sampling.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
