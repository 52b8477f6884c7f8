"""One process of a real 2-process x 4-CPU-device JAX job training the Flax NNX model of
tests/workloads/optimizer_model.py with optax's clip_by_global_norm + adamw on a mesh (("data", 2), ("model", 4)):
"data" crosses the processes (row i holds process i's devices), "model" stays in one. Run as a child by
tests/e2e/test_optimizer_programs.py.

Usage: optimizer_job.py --coordinator HOST:PORT --process-id I [--every E]

Joins the job with jax.distributed (gloo collectives over loopback), starts jaxmon embedded (sampled traces every
E steps, 2 steps each) and prints `OK {"url": ..., "devices": [...], "peak": ...}` (`peak`: the step program's
predicted peak memory, as its own memory analysis says). Commands on stdin (both processes must get the same
ones: each step's collectives need both), each answered `OK`:
  run N    N train steps (each waited for), handed to jaxmon.step(); answers {"steps": handed}
  exit
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ["JAX_NUM_CPU_DEVICES"] = "4"
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax
import numpy as np
from jax.sharding import Mesh

import jaxmon
from jaxmon.logsetup import configure_logging
from tests.workloads.optimizer_model import flax_step

ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # gloo prints to fd 1: keep it out of the answers


def answer(**fields: object) -> None:
    print("OK " + json.dumps(fields), file=ANSWERS, flush=True)


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
        0, workload="optimizer", collector={"probe": False, "training": training}, poll={"interval": 0.2}
    )
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    step, step_args = flax_step(mesh)
    peak = step.lower(*step_args).compile().memory_analysis().peak_memory_in_bytes
    train = jaxmon.track(step)
    answer(url=exporter.url, devices=[d.id for d in jax.local_devices()], peak=int(peak))
    handed = 0
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "run":
            for _ in range(int(rest[0])):
                loss = train(*step_args)
                jaxmon.step(handed, loss)
                handed += 1
                jax.block_until_ready(loss)
            answer(steps=handed)
        elif cmd == "exit":
            break
    exporter.stop()
    answer(stopped=True)
    os._exit(0)


if __name__ == "__main__":
    main()
