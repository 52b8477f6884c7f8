"""One process of a real 2-process x 4-CPU-device JAX job with a mesh (("proc", 2), ("local", 4)), run as a child by
tests/e2e/test_links.py.

Usage: links_job.py --coordinator HOST:PORT --process-id I [--every E]

Joins the job with jax.distributed (gloo collectives over loopback), starts jaxmon embedded (sampled traces every
E steps, 2 steps each) and prints `OK {"url": ..., "sizes": {...}}`: the bytes one call of the step moves per device
over each axis (nccl-tests' convention: an all-reduce moves its buffer). The step, a shard_map over the mesh:
a psum over "proc" of the device's (R x C) block, then a psum over "local" of a (R x 2C) block made from its result
(dependent: one collective at a time on each device).

Two meshes over the same 8 devices, both named (("proc", 2), ("local", 4)):
  normal:  row i holds process i's 4 devices: "proc" crosses the processes (network), "local" stays in one (local);
  swapped: the devices transposed, (4, 2) -> (2, 4): "proc" pairs two devices of one process (local), "local"
           spans both processes (network).

Commands on stdin (every process must get the same ones: the steps' collectives need both), each answered `OK`:
  run MESH N   N steps of MESH's tracked step (each waited for), handed to jaxmon.step(); answers {"steps": handed}
  exit
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

os.environ["JAX_NUM_CPU_DEVICES"] = "4"
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmon
from jaxmon.logsetup import configure_logging

ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # gloo prints to fd 1: keep it out of the answers

R, C = 64, 32
F32 = 4
SIZES = {"proc": R * C * F32, "local": R * 2 * C * F32}


def answer(**fields: object) -> None:
    print("OK " + json.dumps(fields), file=ANSWERS, flush=True)


def meshes() -> dict[str, Mesh]:
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    normal = np.array(devices).reshape(2, 4)
    swapped = np.array(devices).reshape(4, 2).T
    return {"normal": Mesh(normal, ("proc", "local")), "swapped": Mesh(swapped, ("proc", "local"))}


def body(block: jax.Array) -> jax.Array:
    a = jax.lax.psum(block, "proc")
    c = jax.lax.psum(jnp.concatenate([a, a], axis=1), "local")
    return jnp.tanh(c[:, :C] + block)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--every", type=int, default=10)
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        args.coordinator, num_processes=2, process_id=args.process_id, coordinator_bind_address=args.coordinator
    )
    training = {"profile": {"every": args.every, "steps": 2, "min_seconds": 0}}
    exporter = jaxmon.start(
        0, workload="links", collector={"probe": False, "training": training}, poll={"interval": 0.2}
    )
    steps: dict[str, tuple[Any, Any]] = {}
    for name, mesh in meshes().items():
        sharding = NamedSharding(mesh, P("proc", "local"))
        x = jax.make_array_from_callback((2 * R, 4 * C), sharding, lambda index: np.ones((R, C), np.float32))
        fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("proc", "local"), out_specs=P("proc", "local")))
        steps[name] = (jaxmon.track(fn), x)
    answer(
        url=exporter.url,
        pid=os.getpid(),
        sizes=SIZES,
        process_index=jax.process_index(),
        devices=[d.id for d in jax.local_devices()],
    )
    handed = 0
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "run":
            fn, x = steps[rest[0]]
            for _ in range(int(rest[1])):
                out = fn(x)
                jaxmon.step(handed, out)
                handed += 1
                jax.block_until_ready(out)
            answer(steps=handed)
        elif cmd == "exit":
            break
    exporter.stop()
    answer(stopped=True)
    os._exit(0)


if __name__ == "__main__":
    main()
