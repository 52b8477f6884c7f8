"""What jaxmon.track() costs the training thread now that it reads XLA's cost analysis there (issue 25).

    .venv/bin/python bench/track_first_call.py            # about 2 minutes on 2 cores

The first call of each new program of a tracked function pays for one lowering and a cache-hit compile on the
calling thread (`fn.lower(avals).compile().cost_analysis()`, so that it lowers in the loop's mesh and sharding
contexts); later calls pay only the wrapper. In one process with jaxmon embedded (probe off), for an MLP training
step of L layers (512 wide, grad and update: a program of some hundred to some thousand HLO ops), in alternating
rounds with a fresh function each time (no trace or compile cache shared between them):

- `first_plain_ms`: the first call of `jax.jit(step)` (trace, lower, compile, run, block);
- `first_tracked_ms`: the same through `jaxmon.track(jax.jit(step))`;
- `measure_ms`: the cost read alone (what the tracked first call adds), timed around `Tracker.measure` right after
  a plain first call, and the compilations it caused (must be 0: the compile is a cache hit);
- `later_call_us`: a later call's wrapper cost, tracked minus plain, over 2 000 calls of a tiny function.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from common import median, mlp_step, save

import jaxmon
from jaxmon import training
from jaxmon.sources.local.workload import CompileCounters

WIDTH = 512


def first_call(fn: Callable[..., Any], params: list[jax.Array], x: jax.Array) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(params, x))
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 32, 128])
    args = ap.parse_args()
    exporter = jaxmon.start(0, workload="bench", collector={"probe": {"enabled": False}})
    tracker = training.current()
    assert tracker is not None
    counters = CompileCounters.installed()
    x = jnp.ones((64, WIDTH))
    results = []
    for layers in args.layers:
        params = [jnp.eye(WIDTH) * 0.5 for _ in range(layers)]
        plain, tracked, measured, compiled = [], [], [], []
        for _ in range(args.rounds):
            plain.append(first_call(jax.jit(mlp_step(layers)), params, x))
            tracked.append(first_call(jaxmon.track(jax.jit(mlp_step(layers))), params, x))
            fn = jax.jit(mlp_step(layers))
            first_call(fn, params, x)
            before = counters.as_dict()["compilations"]
            start = time.perf_counter()
            program = tracker.measure(fn, (params, x), {})
            measured.append((time.perf_counter() - start) * 1e3)
            compiled.append(counters.as_dict()["compilations"] - before)
            assert program.cost is not None and program.cost.flops
        ops = len(jax.jit(mlp_step(layers)).lower(params, x).as_text().splitlines())
        row = {
            "layers": layers,
            "hlo_lines": ops,
            "first_plain_ms": median(plain),
            "first_tracked_ms": median(tracked),
            "measure_ms": median(measured),
            "measure_compilations": max(compiled),
            "rounds": args.rounds,
        }
        print(row, flush=True)
        results.append(row)
    tiny = jax.jit(lambda v: v + 1.0)
    wrapped = jaxmon.track(jax.jit(lambda v: v + 1.0))
    v = jnp.ones(4)
    jax.block_until_ready((tiny(v), wrapped(v)))
    per_call: dict[str, list[float]] = {"plain": [], "tracked": []}
    for _ in range(args.rounds):
        for name, fn in (("plain", tiny), ("tracked", wrapped)):
            start = time.perf_counter()
            out = v
            for _ in range(2000):
                out = fn(out)
            jax.block_until_ready(out)
            per_call[name].append((time.perf_counter() - start) / 2000 * 1e6)
    later = {k: median(v) for k, v in per_call.items()}
    exporter.stop()
    save(
        "track_first_call",
        {
            "programs": results,
            "later_call_us": {**later, "tracked_minus_plain": later["tracked"] - later["plain"]},
        },
    )


if __name__ == "__main__":
    main()
