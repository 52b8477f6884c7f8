"""A JAX training loop on a ("data", "model") = (4, 2) mesh of the 8 CPU devices with replicated parameters and
host-offloaded optimizer state, under jaxmon.start(); run as a child by tests/e2e/test_memory_placement.py.

Usage: placement.py [--port P] [--interval S]. The loop keeps, between steps:
  params w (256 x 128) and b (128), float32, fully replicated over the mesh (`P()`), donated to each step;
  emb (512 x 256), float32, sharded over both axes (`P("data", "model")`), frozen;
  a batch x (64 x 256), y (64 x 128), float32, sharded over "data" (each shard on the two "model" devices);
  mu, the momentum of w, in pinned_host memory replicated over the mesh: moved to the devices for each step and
  back after it;
  ckpt (1000 float32) in unpinned_host memory attached to device 0.
Its first line is `OK {"url": ..., "expected": {...}}`: per device, the bytes the loop's arrays put in device memory
(`live`), in replicated arrays (`replicated`) and in each host memory kind (`host`), from their nbytes and the layout
above. Then it trains until stdin closes or says `exit`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

import jaxmon
from jaxmon.logsetup import configure_logging


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.2)
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)

    devices = jax.devices()
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    replicated = NamedSharding(mesh, PartitionSpec())
    batch = NamedSharding(mesh, PartitionSpec("data"))
    offloaded = NamedSharding(mesh, PartitionSpec(), memory_kind="pinned_host")
    rng = np.random.default_rng(0)
    params = {
        "w": jax.device_put(np.zeros((256, 128), np.float32), replicated),
        "b": jax.device_put(np.zeros((128,), np.float32), replicated),
    }
    emb = jax.device_put(
        rng.standard_normal((512, 256), dtype=np.float32), NamedSharding(mesh, PartitionSpec("data", "model"))
    )
    x = jax.device_put(rng.standard_normal((64, 256), dtype=np.float32), batch)
    y = jax.device_put(rng.standard_normal((64, 128), dtype=np.float32), batch)
    mu = jax.device_put(np.zeros((256, 128), np.float32), offloaded)
    ckpt = jax.device_put(np.zeros(1000, np.float32), SingleDeviceSharding(devices[0], memory_kind="unpinned_host"))

    def loss_fn(p: dict[str, jax.Array], x: jax.Array, y: jax.Array, emb: jax.Array) -> jax.Array:
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2) + 1e-6 * jnp.mean(emb)

    def train_step(
        p: dict[str, jax.Array], mu: jax.Array, x: jax.Array, y: jax.Array, emb: jax.Array
    ) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
        loss, g = jax.value_and_grad(loss_fn)(p, x, y, emb)
        mu = 0.9 * mu + g["w"]
        return {"w": p["w"] - 0.01 * mu, "b": p["b"] - 0.01 * g["b"]}, mu, loss

    step = jax.jit(
        train_step,
        donate_argnums=(0, 1),
        out_shardings=({"w": replicated, "b": replicated}, replicated, replicated),
    )

    def one_step() -> None:
        nonlocal params, mu
        on_device = jax.device_put(mu, replicated)
        params, on_device, loss = step(params, on_device, x, y, emb)
        mu = jax.device_put(on_device, offloaded)
        del on_device
        float(loss)  # synced: the step's temporaries are gone before the loop sleeps

    one_step()  # compiled, and the steady state between steps reached
    n = len(devices)
    rep = params["w"].nbytes + params["b"].nbytes  # each device holds the whole of a replicated array
    live = {str(d.id): rep + emb.nbytes // n + (x.nbytes + y.nbytes) // 4 for d in devices}  # x, y: 1/4 each
    host: dict[str, dict[str, int]] = {str(d.id): {"pinned_host": mu.nbytes, "unpinned_host": 0} for d in devices}
    host[str(devices[0].id)]["unpinned_host"] = ckpt.nbytes
    expected: dict[str, Any] = {"live": live, "replicated": {str(d.id): rep for d in devices}, "host": host}

    exporter = jaxmon.start(args.port, workload="placement", poll={"interval": args.interval})
    print("OK " + json.dumps({"url": exporter.url, "expected": expected}), flush=True)
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    steps = 0
    while not stop.is_set():
        one_step()
        steps += 1
        time.sleep(0.02)  # most polls land between steps, where the layout above holds
    print("OK " + json.dumps({"steps": steps}), flush=True)
    exporter.stop()


if __name__ == "__main__":
    main()
