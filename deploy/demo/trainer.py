"""A toy JAX training loop for the compose demo: data-parallel over the local devices, publishing to the spool.

    python deploy/demo/trainer.py [--spool /run/jaxmon] [--workload demo-trainer] [--steps N]

It trains a small MLP forever (or for --steps), sharding the batch over every local device, and calls
`jaxmon.publish()` so the jaxmon sidecar reading the same directory exports its memory and compilations.
Every few minutes it evaluates on a new batch size, so the dashboard shows a compilation now and then.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--spool", default="/run/jaxmon")
    ap.add_argument("--workload", default="demo-trainer")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between published snapshots")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: never)")
    args = ap.parse_args()

    publisher = jaxmon.publish(args.spool, workload=args.workload, interval=args.interval)
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())

    rng = np.random.default_rng(0)
    params = jax.device_put(
        {
            "w1": rng.standard_normal((256, 512), dtype=np.float32) * 0.05,
            "w2": rng.standard_normal((512, 1), dtype=np.float32) * 0.05,
        },
        replicated,
    )

    def loss(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    @jax.jit
    def step(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return jax.tree.map(lambda a, g: a - 0.01 * g, p, grads), value

    evaluate = jax.jit(loss)
    batch = 64 * len(devices)
    n = 0
    started = time.monotonic()
    try:
        while not args.steps or n < args.steps:
            x = jax.device_put(rng.standard_normal((batch, 256), dtype=np.float32), batch_sharding)
            y = jax.device_put(rng.standard_normal((batch, 1), dtype=np.float32), batch_sharding)
            params, value = step(params, x, y)
            n += 1
            if n % 500 == 0:
                # An eval batch of a size not seen before: one more compilation.
                size = len(devices) * (8 + (n // 500) % 16)
                xe = jax.device_put(rng.standard_normal((size, 256), dtype=np.float32), batch_sharding)
                ye = jax.device_put(rng.standard_normal((size, 1), dtype=np.float32), batch_sharding)
                print(f"step {n} loss {float(value):.4f} eval {float(evaluate(params, xe, ye)):.4f}", flush=True)
            time.sleep(0.01)
    finally:
        publisher.stop()
    print(f"done: {n} steps in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
