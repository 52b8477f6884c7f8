"""A JAX training loop under jaxmon.start() that checkpoints with the real Orbax (an async CheckpointManager), restores
the latest checkpoint when there is one, and ends as the test says: run as a child process by tests/e2e/test_churn.py,
once per process of a job that crashes and is restarted, or one job each way it can end.

Usage: churn.py PORT WORKLOAD DIR [--steps N] [--save-every K] [--crash-after M] [--end HOW] [--until-told].
Writes DIR/log-<pid>.jsonl as it goes: first {"started": Unix time before jaxmon.start(), "monitored": after it,
"restored": step or null},
then one {"n", "t0", "t1", ...} a step (Unix times before it was dispatched and after it was seen complete, and what
the process's tracker had booked once it booked the step: its productive and accounted seconds, its last step's time
and its start), so that a process that dies has written every step it did. Prints `OK {"url": ...}` once serving, and
  - steps up to step N - 1 (from the step after the restored one), saving every K steps, or without end with
    --until-told, until a line on stdin says how to end;
  - after step M (--crash-after) raises an uncaught exception; at the end it ends HOW: normal (the script's end: the
    interpreter's exit says so), exception (an uncaught exception), sigkill (killed outright).
"""

from __future__ import annotations

import argparse
import json
import os
import select
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

SIZE = 1024  # the step's matmul: tens of milliseconds on a 2-core machine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("workload")
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--crash-after", type=int, default=None)
    ap.add_argument("--end", choices=("normal", "exception", "sigkill"), default="normal")
    ap.add_argument("--until-told", action="store_true")
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)
    root = Path(args.dir)
    log = open(root / f"log-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115 - open until the process ends
    started = time.time()
    exporter = jaxmon.start(
        args.port,
        workload=args.workload,
        poll={"interval": 0.1},
        collector={"probe": False, "checkpoint": {"interval_steps": args.save_every}},
    )
    monitored = time.time()  # jaxmon's tracker counts the process's time from about here
    manager = ocp.CheckpointManager(
        root / "ckpt", options=ocp.CheckpointManagerOptions(save_interval_steps=args.save_every, max_to_keep=2)
    )
    w = jnp.ones((SIZE, SIZE)) / SIZE
    restored = manager.latest_step()
    if restored is not None:
        w = manager.restore(restored, args=ocp.args.StandardRestore({"w": w}))["w"]
    log.write(json.dumps({"started": started, "monitored": monitored, "restored": restored}) + "\n")
    answer(url=exporter.url, pid=os.getpid())
    update = jax.jit(lambda w: jnp.tanh(w @ w) * 0.5 + 0.5 / SIZE)
    n = 0 if restored is None else restored + 1
    how = args.end
    while args.until_told or n < args.steps:
        t0 = time.time()
        w = update(w)
        jaxmon.step(n, w)
        jax.block_until_ready(w)
        t1 = time.time()
        booked(n)
        tracker = jaxmon.training.current()
        r = None if tracker is None else tracker.reading()
        assert r is not None
        accounted = r.productive_seconds_total + sum(r.badput_seconds_total.values())
        entry = {"n": n, "t0": t0, "t1": t1, "productive": r.productive_seconds_total, "accounted": accounted}
        log.write(json.dumps({**entry, "last": r.last_step_timestamp, "start": r.start_time_seconds}) + "\n")
        if n % args.save_every == 0:
            manager.save(n, args=ocp.args.StandardSave({"w": w}))
        if args.crash_after is not None and n == args.crash_after:
            raise RuntimeError(f"the job fails after step {n}")  # uncaught: the interpreter's exit, a crash
        n += 1
        if args.until_told and select.select([sys.stdin], [], [], 0)[0]:
            how = sys.stdin.readline().strip()
            break
    manager.wait_until_finished()
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exception":
        raise RuntimeError("the job fails")
    # normal: the script ends; the interpreter's exit stops jaxmon, whose last word says so


if __name__ == "__main__":
    main()
