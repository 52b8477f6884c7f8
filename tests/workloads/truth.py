"""A JAX training loop under jaxmon.start() that evals (a declared badput kind), checkpoints with the real Orbax and
takes sampled traces, run as a child process by tests/e2e/test_prometheus_truth.py, once per process of a workload
that restarts: the test's real Prometheus scrapes it, and compares increase() over the runs with what each run's
own counters and timings say.

Usage: truth.py PORT WORKLOAD DIR. Answers `OK {"url": ...}`, then reads commands on stdin, each answered with
`OK <json>`:
  run    STEPS steps; an eval (jaxmon.badput("eval")) every EVAL steps and an Orbax save every SAVE; then wait
         until jaxmon's polls hold the last step and the sampled traces are done, and answer with the counters as
         the process's tracker has them (badput by kind, productive seconds, tokens, sampled parts and results) and
         the seconds the loop measured around its evals and saves
  crash  half a run, then SIGKILL itself (no answer: a process that dies says nothing)
  exit   jaxmon.stop() (its last scrape says it stopped), answer, and leave
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

import jaxmon
import jaxmon.training
from jaxmon.logsetup import configure_logging
from tests.workloads.protocol import answer, booked

# The sampled blocks (jaxmon.training.blocks): 10; 20 (a save before it: skipped) and its retry 24 (an eval: skipped,
# and no room for another before 30); 30 (an eval: skipped) and its retry 32; 40 (a save: skipped) and its retry 44;
# 50. Block 60, asked for at step 58, never completes.
STEPS = 60
EVAL = 6
SAVE = 20
DATA_SECONDS = 0.03  # the host's time before each step (host badput): runs of a few seconds, many scrapes
EVERY = 10  # sampled traces' interval (2 steps each)
TOKENS = 4096
EVAL_SECONDS = 0.05


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("workload")
    ap.add_argument("dir")
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)
    root = Path(args.dir) / str(os.getpid())
    # Orbax's first use in a process compiles programs inside the save: done before jaxmon starts, so that the
    # checkpoint badput below is the saves' alone (as tests/workloads/checkpoint.py does).
    ocp.Checkpointer(ocp.StandardCheckpointHandler()).save(
        root / "warm", args=ocp.args.StandardSave({"w": jnp.ones(8)})
    )
    exporter = jaxmon.start(
        args.port,
        workload=args.workload,
        poll={"interval": 0.1},
        collector={"probe": False},
        training={"badput_kinds": ["eval"], "profile": {"every": EVERY, "steps": 2, "min_seconds": 0}},
    )
    answer(url=exporter.url, pid=os.getpid())
    saver = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    # Orbax's own timing of its saves (what it records as each ends): the least checkpoint badput can be.
    timed = {"checkpoint": 0.0}

    def orbax_timed(event: str, duration_secs: float, **_: str | int) -> None:
        if event == "/jax/orbax/write/total_duration_secs":
            timed["checkpoint"] += duration_secs

    jax.monitoring.register_event_duration_secs_listener(orbax_timed)
    update = jax.jit(lambda w: jnp.tanh(w @ w) * 0.5)
    w = jnp.ones((128, 128)) / 128

    def run(steps: int) -> dict[str, float]:
        nonlocal w
        measured = {"eval": 0.0, "checkpoint": 0.0}
        for n in range(steps):
            time.sleep(DATA_SECONDS)
            w = update(w)
            jaxmon.step(n, w, tokens=TOKENS)
            jax.block_until_ready(w)
            booked(n)  # what follows starts after jaxmon saw the step complete: device idle, all of it badput
            if n == steps - 1:
                break  # a badput block after the last step is charged at the next step's completion: none comes
            if n % EVAL == EVAL - 1:
                t0 = time.monotonic()
                with jaxmon.badput("eval"):
                    time.sleep(EVAL_SECONDS)
                measured["eval"] += time.monotonic() - t0
            if n % SAVE == SAVE - 1:
                t0 = time.monotonic()
                saver.save(root / f"step-{n}", args=ocp.args.StandardSave({"w": w}))
                measured["checkpoint"] += time.monotonic() - t0
        return measured

    for line in sys.stdin:
        cmd = line.split()[0]
        if cmd == "run":
            measured = run(STEPS)
            tracker = jaxmon.training.current()
            assert tracker is not None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # every sample of the run counted (block STEPS never completes)
                block = tracker.sampler.block
                if block is None or block >= STEPS:
                    break
                time.sleep(0.05)
            time.sleep(0.5)  # a few polls
            reading = tracker.reading()
            profile = tracker.sampler.reading()
            assert reading is not None and profile is not None
            parts: dict[str, float] = {}
            for d in profile.devices:
                for part, seconds in d.parts.items():
                    parts[part] = parts.get(part, 0.0) + seconds
            answer(
                badput=dict(reading.badput_seconds_total),
                productive=reading.productive_seconds_total,
                tokens=reading.tokens_total,
                steps=reading.steps_total,
                start_time=reading.start_time_seconds,
                last_step=reading.last_step_timestamp,
                parts=parts,
                results=dict(profile.results),
                measured=measured,
                timed=dict(timed),
            )
        elif cmd == "crash":
            run(STEPS // 2)
            time.sleep(0.5)  # a few polls and scrapes of the half run
            os.kill(os.getpid(), signal.SIGKILL)
        elif cmd == "exit":
            break
    exporter.stop()
    answer(stopped=True)


if __name__ == "__main__":
    main()
