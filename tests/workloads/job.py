"""One process of a real multi-process JAX training job, run as a child by tests/e2e/test_job_view.py.

Usage: job.py --coordinator HOST:PORT --processes N --process-id I --workload NAME [--size S]

Joins the job with jax.distributed (CPU devices, gloo collectives over loopback; one CPU device per process),
starts jaxmon embedded on an ephemeral port and prints `OK {"url": ..., "pid": ...}`. A thread then trains: each
step is an N-device matmul whose result is summed across the processes (a psum, so every process's step waits
for every other's, as in a synchronous data-parallel job), handed to jaxmon.step(n, out), and the loop keeps one
step in flight (it waits for step n-1 after dispatching step n, as a loop that logs the previous loss does).

Commands on stdin, one per line, each answered with `OK <json>`:
  delay MS     sleep MS before dispatching each step from now on (a host-bound process: a slow input pipeline)
  stall        stop dispatching steps; jaxmon keeps serving (a hung input pipeline)
  status       the last dispatched step number
  exit
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ["JAX_NUM_CPU_DEVICES"] = "1"
# One XLA thread per process: four processes share the machine's two cores without oversubscribing them.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
from jaxmon.logsetup import configure_logging

# Answers go to the original stdout; everything else written to fd 1 (gloo's C++ prints its connections there)
# goes to stderr, so that the test reads only answers.
ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def answer(**fields: object) -> None:
    print("OK " + json.dumps(fields), file=ANSWERS, flush=True)


class Loop:
    """The training thread: dispatch, report, wait for the previous step; `delay` and `stall` steer it."""

    def __init__(self, size: int) -> None:
        self.delay = 0.0
        self.stalled = threading.Event()
        self.dispatched = -1
        mesh = Mesh(np.array(jax.devices()), ("p",))
        sharded = NamedSharding(mesh, PartitionSpec("p"))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        count = jax.device_count()
        # Each process holds its shard of x (its batch) and a replica of w.
        local = np.random.default_rng(jax.process_index()).standard_normal((size, size), dtype=np.float32) / size
        self.x = jax.make_array_from_process_local_data(sharded, local, (size * count, size))
        self.w = jax.device_put(np.eye(size, dtype=np.float32), self.replicated)

        @jax.jit
        def step(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
            y = jnp.tanh(x @ w)
            # The mean over the whole batch is a cross-process reduction: no process's step completes before every
            # process has dispatched it.
            loss = jnp.mean(y)
            return jax.lax.with_sharding_constraint(w + 1e-3 * loss, self.replicated), loss

        self.step = step

    def run(self) -> None:
        previous = None
        n = 0
        while not self.stalled.is_set():
            if self.delay:
                time.sleep(self.delay)
            w, loss = self.step(self.x, self.w)
            self.w = w
            jaxmon.step(n, loss)
            self.dispatched = n
            if previous is not None:
                jax.block_until_ready(previous)
            previous = loss
            n += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--size", type=int, default=512)
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # The coordinator listens on loopback only (its default is every interface).
    jax.distributed.initialize(
        args.coordinator,
        num_processes=args.processes,
        process_id=args.process_id,
        coordinator_bind_address=args.coordinator,
    )
    exporter = jaxmon.start(0, workload=args.workload, collector={"probe": False}, poll={"interval": 0.5})
    loop = Loop(args.size)
    answer(url=exporter.url, pid=os.getpid(), process_index=jax.process_index(), devices=jax.device_count())
    threading.Thread(target=loop.run, name="train", daemon=True).start()
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "delay":
            loop.delay = float(rest[0]) / 1000
            answer(delay_ms=float(rest[0]))
        elif cmd == "stall":
            loop.stalled.set()
            answer(dispatched=loop.dispatched)
        elif cmd == "status":
            answer(dispatched=loop.dispatched)
        elif cmd == "exit":
            break
    # The other processes may be blocked in a collective this one no longer joins: leave without waiting for them
    # (jax.distributed's shutdown barrier would).
    exporter.stop()
    answer(stopped=True)
    os._exit(0)


if __name__ == "__main__":
    main()
