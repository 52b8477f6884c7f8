"""A training process whose sampled traces are large (megabytes: read by jaxmon's child reader), run as a real child
by tests/e2e/test_trace_split.py.

Usage: big_trace.py [--every E] [--iterations K]

jaxmon.start() embedded (sampled traces every E steps, 2 steps each, no probe); the step is a tracked program of a
K-iteration loop of small ops (on CPU each iteration's ops are trace events: about 0.5 MB of trace a step at
K = 1000). Answers `OK {"url": ..., "pid": ...}`, then commands on stdin, each answered `OK`:
  run N [PAUSE_MS]  N steps (numbered on), each handed to jaxmon.step() and waited for, then PAUSE_MS of sleep
                    (a trace then starts before its block's steps, however slow its start); answers {"steps": handed}
  exit     return from main: the interpreter exits as a training script's does (jaxmon's exit callbacks run)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ["JAX_NUM_CPU_DEVICES"] = "1"
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax
import jax.numpy as jnp

import jaxmon
from jaxmon.logsetup import configure_logging


def answer(**fields: object) -> None:
    print("OK " + json.dumps(fields), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=3000)
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)
    training = {"profile": {"every": args.every, "steps": 2, "min_seconds": 0}}
    exporter = jaxmon.start(0, workload="big", collector={"probe": False, "training": training})

    def body(i: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ x) * 0.5 + x[::-1]

    step = jaxmon.track(jax.jit(lambda x: jax.lax.fori_loop(0, args.iterations, body, x)))
    x = jnp.ones((8, 8))
    jax.block_until_ready(step(x))  # compiled before the first step
    answer(url=exporter.url, pid=os.getpid())
    handed = 0
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "run":
            pause = float(rest[1]) / 1000 if len(rest) > 1 else 0.0
            for _ in range(int(rest[0])):
                out = step(x)
                jaxmon.step(handed, out)
                handed += 1
                jax.block_until_ready(out)
                time.sleep(pause)
            answer(steps=handed)
        elif cmd == "exit":
            break


if __name__ == "__main__":
    main()
