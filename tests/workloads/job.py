"""One process of a real multi-process JAX training job, run as a child by tests/e2e/test_job_view.py.

Usage: job.py --coordinator HOST:PORT --processes N --process-id I --workload NAME [--size S]

Joins the job with jax.distributed (CPU devices, gloo collectives over loopback; one CPU device per process),
starts jaxmon embedded on an ephemeral port and prints `OK {"url": ..., "pid": ...}`. A thread then trains: each
step is an N-device matmul, a loop of more matmuls on each device (no turns but in a process told `slow`), and a
mean over the whole batch (a cross-process reduction, so every process's step waits for every other's, as in a
synchronous data-parallel job), handed to jaxmon.step(n, out, examples=, tokens=) with
the JOB's figures (the global batch and its tokens, as every process of a job passes them), and the loop keeps one
step in flight (it waits for step n-1 after dispatching step n, as a loop that logs the previous loss does).

Commands on stdin, one per line, each answered with `OK <json>`:
  delay MS     sleep MS before dispatching each step from now on, its step in flight waited for first (a host-bound
               process: a slow input pipeline; its devices idle for the whole sleep); answers the last step
               dispatched before (`dispatched`: every step numbered 2 or more after it is delayed)
  slow MS      make this process's device compute about MS longer in each step from now on, before the step's
               cross-process reduction (a device that computes slowly: the others wait for it there): its loop of
               matmuls runs MS / (one matmul's time, measured at start) turns. Not a host callback that sleeps: on
               CPU devices XLA runs a program with a host callback at its dispatch, so the training thread would
               wait out the sleep (a host-bound process), where a GPU's or TPU's stream waits with the host ahead.
               Answers the turns and the last step dispatched before
  stall        stop dispatching steps; jaxmon keeps serving (a hung input pipeline)
  status       the last dispatched step number, and the job's tokens per second over the last 30 s as this loop
               measures them (steps it saw complete x the global batch's tokens, over wall time): `tokens_per_second`
               and the unix `time` it was taken at; `started`: when the first step completed (unix time)
  exit
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import deque

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


# Each row of the global batch stands for a sequence of this many tokens.
TOKENS_PER_EXAMPLE = 128
WINDOW = 30.0


class Loop:
    """The training thread: dispatch, report, wait for the previous step; `delay` and `stall` steer it."""

    def __init__(self, size: int) -> None:
        self.delay = 0.0
        self.stalled = threading.Event()
        self.dispatched = -1
        # (unix time, steps seen complete) after each completion, the last minute's and one before it.
        self.completions: deque[tuple[float, int]] = deque()
        self.lock = threading.Lock()
        self.started = 0.0
        mesh = Mesh(np.array(jax.devices()), ("p",))
        sharded = NamedSharding(mesh, PartitionSpec("p"))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        count = jax.device_count()
        # The job's figures for one step: the global batch (every process's rows) and its tokens.
        self.examples = size * count
        self.tokens = self.examples * TOKENS_PER_EXAMPLE
        # Each process holds its shard of x (its batch) and a replica of w.
        local = np.random.default_rng(jax.process_index()).standard_normal((size, size), dtype=np.float32) / size
        self.x = jax.make_array_from_process_local_data(sharded, local, (size * count, size))
        self.w = jax.device_put(np.eye(size, dtype=np.float32), self.replicated)
        # Each device's turns of its loop of matmuls (`slow`): every process runs the same program, its own count.
        self._count_sharding = NamedSharding(mesh, PartitionSpec("p"))
        self.turns = self._turns(0)

        def burn(block: jax.Array, turns: jax.Array) -> jax.Array:
            """A device's shard after `turns` matmuls of it, which the reduction then reads (1e-30 of their sum:
            nothing of the step's figures, but nothing XLA may drop either)."""
            looped = jax.lax.fori_loop(0, turns[0], lambda _, b: jnp.tanh(b @ b), block)
            return block + 1e-30 * jnp.sum(looped)

        slowed = jax.shard_map(
            burn, mesh=mesh, in_specs=(PartitionSpec("p"), PartitionSpec("p")), out_specs=PartitionSpec("p")
        )

        @jax.jit
        def step(x: jax.Array, w: jax.Array, turns: jax.Array) -> tuple[jax.Array, jax.Array]:
            y = slowed(jnp.tanh(x @ w), turns)
            # The mean over the whole batch is a cross-process reduction: no process's step completes before every
            # process has dispatched it.
            loss = jnp.mean(y)
            return jax.lax.with_sharding_constraint(w + 1e-3 * loss, self.replicated), loss

        self.step = step
        # One matmul of a shard, timed on this device before the loop starts (the median of a few).
        matmul = jax.jit(lambda b: jnp.tanh(b @ b))
        block = jnp.asarray(local)
        matmul(block).block_until_ready()
        times = []
        for _ in range(7):
            began = time.perf_counter()
            matmul(block).block_until_ready()
            times.append(time.perf_counter() - began)
        self.matmul_seconds = sorted(times)[len(times) // 2]

    def _turns(self, turns: int) -> jax.Array:
        """The job's array of loop turns, this process's devices at `turns`."""
        count = jax.device_count()
        local = np.full((jax.local_device_count(),), turns, dtype=np.int32)
        return jax.make_array_from_process_local_data(self._count_sharding, local, (count,))

    def slow(self, ms: float) -> int:
        """Make this process's device compute about `ms` longer each step; the loop's turns."""
        turns = round(ms / 1000 / self.matmul_seconds)
        self.turns = self._turns(turns)
        return turns

    def run(self) -> None:
        previous = None
        n = 0
        completed = 0
        while not self.stalled.is_set():
            if self.delay:
                if previous is not None:  # its devices done first: they idle for the whole sleep, whatever the
                    jax.block_until_ready(previous)  # other processes' pace (they wait for this one, not it for them)
                time.sleep(self.delay)
            w, loss = self.step(self.x, self.w, self.turns)
            self.w = w
            jaxmon.step(n, loss, examples=self.examples, tokens=self.tokens)
            self.dispatched = n
            if previous is not None:
                jax.block_until_ready(previous)
                completed += 1
                now = time.time()
                self.started = self.started or now
                with self.lock:
                    self.completions.append((now, completed))
                    while len(self.completions) > 2 and self.completions[1][0] <= now - WINDOW:
                        self.completions.popleft()
            previous = loss
            n += 1

    def tokens_per_second(self) -> tuple[float, float]:
        """The job's tokens per second over the last WINDOW seconds, as this loop measures them, and when."""
        now = time.time()
        with self.lock:
            first = next(((t, c) for t, c in self.completions if t >= now - WINDOW), None)
            last = self.completions[-1] if self.completions else None
        if first is None or last is None or last[0] <= first[0]:
            return 0.0, now
        return (last[1] - first[1]) * self.tokens / (last[0] - first[0]), now


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
            answer(delay_ms=float(rest[0]), dispatched=loop.dispatched)  # the steps after the next one sleep first
        elif cmd == "slow":
            turns = loop.slow(float(rest[0]))
            answer(slow_ms=float(rest[0]), turns=turns, dispatched=loop.dispatched)
        elif cmd == "stall":
            loop.stalled.set()
            answer(dispatched=loop.dispatched)
        elif cmd == "status":
            rate, at = loop.tokens_per_second()
            answer(dispatched=loop.dispatched, tokens_per_second=rate, time=at, started=loop.started)
        elif cmd == "exit":
            break
    # The other processes may be blocked in a collective this one no longer joins: leave without waiting for them
    # (jax.distributed's shutdown barrier would).
    exporter.stop()
    answer(stopped=True)
    os._exit(0)


if __name__ == "__main__":
    main()
