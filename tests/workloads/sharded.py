"""A sharded JAX training loop under `Mesh(("data", "model"), (4, 2))` on 8 CPU devices, with jaxmon embedded and
sampled traces on, run as a real child process by tests/e2e/test_profile.py (and bench/profile_sampling.py).

Usage: sharded.py --port P --kind {allreduce,local} [--every N] [--profile-steps S] [--web-config FILE] [--size D]
`allreduce`: a step whose gradient of a replicated D x D weight, from a batch sharded over `data` (8 rows per
device: little compute), is all-reduced over `data`; `local`: a block of weights per device, multiplied on its
device: no collective at all. Commands on stdin, one per line, each answered on stdout with `OK <json>`:
  steps N              run N steps (numbered on from the last), each handed to jaxmon.step() and then synced by
                       this loop; answer with each step's number and the loop's own completion time
                       (time.monotonic) after waiting for jaxmon's waiter to book the last one
  usertrace DIR N      the same N steps inside the user's own `with jax.profiler.trace(DIR)`
  cadence N E S DIR T  the same N steps, and after each step whose number + 1 is a multiple of E an eval
                       (`jaxmon.badput("eval")` of T seconds), of S a synchronous Orbax save of the weights into DIR
                       (the real Orbax: jaxmon reads its save event; one first, before the steps); answers as `steps`,
                       with the numbers the evals and saves followed
  exit
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
import jaxmon.training
from tests.workloads.protocol import answer, booked

MODULE = "jit_sharded_step"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", choices=("allreduce", "local"), required=True)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument("--web-config", default=None)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    d = args.size
    x = jax.device_put(jnp.ones((32, d), jnp.float32), NamedSharding(mesh, PartitionSpec("data")))
    if args.kind == "allreduce":
        w = jax.device_put(jnp.ones((d, d), jnp.float32) / d, NamedSharding(mesh, PartitionSpec()))

        def sharded_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
            return w - 1e-3 * g, loss  # g: the replicated gradient, all-reduced over data

    else:
        # Eight blocks of weights, one per device: each device multiplies its own, and the loss keeps the blocks'
        # sharding (a scalar would be a collective).
        b = d // 4
        w = jax.device_put(jnp.ones((8, b, b), jnp.float32) / b, NamedSharding(mesh, PartitionSpec(("data", "model"))))

        def sharded_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            w = jax.lax.fori_loop(0, 8, lambda _, w: jnp.tanh(jnp.einsum("bij,bjk->bik", w, w)), w)
            return w, jnp.sum(w, axis=(1, 2))

    step = jax.jit(sharded_step)
    w, loss = step(w, x)  # compiled before jaxmon starts
    loss.block_until_ready()

    web: dict[str, Any] = {"enable_profiling": True}
    if args.web_config:
        web["config"] = {"file": args.web_config}
    jaxmon.start(
        args.port,
        workload="sharded",
        web=web,
        collector={"training": {"profile": {"every": args.every, "steps": args.profile_steps, "min_seconds": 0}}},
    )
    answer(module=MODULE)

    number = 0

    def run(n: int, after: Any = None) -> list[tuple[int, float]]:
        nonlocal w, number
        done = []
        for _ in range(n):
            w, loss = step(w, x)
            jaxmon.step(number, loss)
            loss.block_until_ready()
            done.append((number, time.monotonic()))
            if after is not None:
                after(number, w)
            number += 1
        booked(number - 1)
        return done

    def cadence(n: int, every_eval: int, every_save: int, directory: str, seconds: float) -> dict[str, Any]:
        import orbax.checkpoint as ocp

        saver = ocp.Checkpointer(ocp.StandardCheckpointHandler())
        # Orbax's first save compiles programs and starts its threads: once here, before the steps (a mark on the
        # next step, which no block holds).
        saver.save(os.path.join(directory, "warm"), args=ocp.args.StandardSave({"w": w}))
        evals, saves = [], []

        def after(k: int, w: jax.Array) -> None:
            if (k + 1) % every_eval == 0:
                with jaxmon.badput("eval"):
                    time.sleep(seconds)
                evals.append(k)
            if (k + 1) % every_save == 0:
                saver.save(os.path.join(directory, f"step-{k}"), args=ocp.args.StandardSave({"w": w}))
                saves.append(k)

        return {"done": run(n, after), "evals": evals, "saves": saves}

    for line in iter(input, "exit"):
        cmd, *rest = line.split()
        if cmd == "steps":
            answer(done=run(int(rest[0])))
        elif cmd == "cadence":
            n, every_eval, every_save = map(int, rest[:3])
            answer(**cadence(n, every_eval, every_save, rest[3], float(rest[4])))
        elif cmd == "usertrace":
            with jax.profiler.trace(rest[0]):
                done = run(int(rest[1]))
            answer(done=done)
        else:
            raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main()
