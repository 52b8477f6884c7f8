"""Tracked training loops whose communication the test knows from their shapes, under jaxmon.start(), on a
("data", "model") = (4, 2) mesh of the 8 CPU devices in a permuted order; run as a child by
tests/e2e/test_communication.py.

Usage: communication.py [--port P] [--spool DIR]. With `--spool`, the process also publishes to DIR (the sidecar's
view of the same tracker). First line: `OK {"url": ...}`. Then, for each command line:
  `phase NAME`: NAME's step function is called once (compiled, tracked) and handed to jaxmon.step(); the child waits
  until jaxmon's analysis thread is done with it (a test's wait: training never waits for it), and answers
  `OK {"peak": ...}`: the program's `compile().memory_analysis().peak_memory_in_bytes`, computed here.
  `run N`: N more steps of that phase, each waited for (XLA:CPU's collectives need steps not to pile up), then
  `OK {"steps": <steps handed so far>}`.
  `exit`: stop.
Phases (shapes below; what each moves per device and step is the test's to compute):
  allreduce: w (D x D, float32, replicated) - lr * grad of sum(tanh(x @ w)), x (B x D) sharded over "data": the
  gradient of the replicated w is all-reduced over "data", with little compute.
  local: the same step with x replicated: no collective.
  scan: a shard_map'd `lax.scan` over L layers (ws: L x D x D), x sharded over "data", each layer a `psum` over
  "data" of the (B/4 x D) block.
  psum_model: a shard_map'd `psum` over "model" of x (B x D) sharded over "model" by columns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
from jaxmon import training

D, B, L = 512, 64, 6
PERMUTED = [3, 1, 0, 2, 7, 5, 6, 4]


def P(*axes: Any) -> PartitionSpec:
    return PartitionSpec(*axes)


def phases(mesh: Mesh) -> dict[str, tuple[Any, list[Any]]]:
    """Each phase's jitted step and its arguments (the first is the carried state)."""

    def put(x: Any, *spec: Any) -> jax.Array:
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    def sgd(w: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = w - 1e-3 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return out

    def layers(x: jax.Array, ws: jax.Array) -> jax.Array:
        def body(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
            return jnp.tanh(h + jax.lax.psum(h @ w, "data")), None

        out: jax.Array = jax.lax.scan(body, x, ws)[0]
        return out

    def psum_model(x: jax.Array) -> jax.Array:
        out: jax.Array = jnp.tanh(jax.lax.psum(x, "model"))
        return out

    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, D), dtype=np.float32) * 0.1
    w = rng.standard_normal((D, D), dtype=np.float32) * 0.01
    ws = rng.standard_normal((L, D, D), dtype=np.float32) * 0.01
    return {
        "allreduce": (jax.jit(sgd), [put(w), put(x, "data")]),
        "local": (jax.jit(sgd), [put(w), put(x)]),
        "scan": (
            jax.jit(jax.shard_map(layers, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))),
            [put(x, "data"), put(ws)],
        ),
        "psum_model": (
            jax.jit(jax.shard_map(psum_model, mesh=mesh, in_specs=P(None, "model"), out_specs=P(None, "model"))),
            [put(x, None, "model")],
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--spool")
    args = ap.parse_args()
    mesh = Mesh(np.array(jax.devices())[PERMUTED].reshape(4, 2), ("data", "model"))
    # A window of 5 steps: the peak gauge is the largest of the programs the last 5 steps called.
    exporter = jaxmon.start(args.port, workload="comm", poll={"interval": 0.2}, training={"window": 5})
    publisher = (
        jaxmon.publish(args.spool, workload="comm", interval=0.2, training={"window": 5}) if args.spool else None
    )
    print("OK " + json.dumps({"url": exporter.url}), flush=True)
    table = phases(mesh)
    handed = 0
    fn: Any = None
    state: list[Any] = []

    def one_step() -> None:
        nonlocal handed
        out = fn(*state)
        state[0] = out
        jaxmon.step(handed, out)
        handed += 1
        jax.block_until_ready(out)

    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "phase":
            raw, state = table[arg]
            fn = jaxmon.track(raw)
            one_step()
            tracker = training.current()
            assert tracker is not None
            deadline = time.monotonic() + 60
            while not tracker._analyzer.idle() and time.monotonic() < deadline:
                time.sleep(0.01)
            analysis = raw.lower(*state).compile().memory_analysis()
            print("OK " + json.dumps({"peak": analysis.peak_memory_in_bytes, "steps": handed}), flush=True)
        elif command == "run":
            for _ in range(int(arg)):
                one_step()
            print("OK " + json.dumps({"steps": handed}), flush=True)
        elif command == "exit":
            break
    if publisher is not None:
        publisher.stop()
    exporter.stop()


if __name__ == "__main__":
    main()
