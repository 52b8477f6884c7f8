"""A JAX training loop under jaxmon.start() that checkpoints with the real Orbax, run as a child process by
tests/e2e/test_orbax.py. It never calls jaxmon.badput(): checkpoint and restore time reaches jaxmon only through
the events Orbax records with jax.monitoring.

Usage: checkpoint.py DIR [--mb N]. Answers `OK {"url": ...}`, then reads commands on stdin, each answered with
`OK <json>`:
  run    train, save with a synchronous ocp.Checkpointer and with an asynchronous ocp.CheckpointManager, restore
         from both, with jaxmon.step() between (so each save and restore lies between two steps, where the device
         waits); answer with the seconds the loop measured around the saves and the restores, the seconds
         Orbax's own events say they blocked (`orbax_saved`, `orbax_restored`), and the steps
  exit
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import jaxmon
from jaxmon.logsetup import configure_logging
from tests.workloads.protocol import answer, booked

SAVES = 3  # of each kind
# The events orbax-checkpoint records for the time a save or restore blocks the caller (docs/training.md): a
# synchronous save records the second, a CheckpointManager's save the first; a restore one of the read names.
SAVE_EVENTS = ("/jax/checkpoint/write/async/blocking_duration_secs", "/jax/orbax/write/total_duration_secs")
RESTORE_EVENTS = ("/jax/orbax/read/total_duration_secs", "/jax/orbax/read/async/blocking_duration_secs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--mb", type=int, default=32, help="the state's size in MiB")
    args = ap.parse_args()
    configure_logging("info", "json", stream=sys.stderr)
    root = Path(args.dir)
    # Orbax's first use in a process compiles XLA programs inside the save and the restore (compile badput, where
    # it overlaps them): done once before jaxmon starts listening, so what the loop measures below is checkpoint
    # and restore time alone.
    warm = {"w": jnp.ones(1024)}
    ocp.Checkpointer(ocp.StandardCheckpointHandler()).save(root / "warm", args=ocp.args.StandardSave(warm))
    ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(root / "warm")
    exporter = jaxmon.start(0, workload="ckpt", poll={"interval": 0.2}, collector={"probe": False})
    orbax = {"saved": 0.0, "restored": 0.0}

    def listener(event: str, duration_secs: float, **_: str | int) -> None:
        kind = "saved" if event in SAVE_EVENTS else "restored" if event in RESTORE_EVENTS else None
        if kind is not None:
            orbax[kind] += duration_secs

    jax.monitoring.register_event_duration_secs_listener(listener)
    answer(url=exporter.url, pid=os.getpid())

    n = args.mb * (1 << 20) // 4 // 2
    rng = np.random.default_rng(0)
    state = {"w": jnp.asarray(rng.standard_normal(n, dtype=np.float32)), "m": jnp.zeros(n, jnp.float32)}
    update = jax.jit(lambda s: {"w": s["w"] * 0.999 + 0.001, "m": s["m"] * 0.9 + s["w"] * 0.1})
    number = 0

    def step() -> None:
        nonlocal state, number
        state = update(state)
        jaxmon.step(number, state["w"])
        jax.block_until_ready(state)
        booked(number)  # the checkpoint that follows starts after jaxmon saw the step complete
        number += 1

    for line in sys.stdin:
        cmd = line.split()[0]
        if cmd == "run":
            saved = restored = 0.0
            orbax.update(saved=0.0, restored=0.0)
            sync = ocp.Checkpointer(ocp.StandardCheckpointHandler())
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            for _ in range(3):
                step()
            for i in range(SAVES):
                written = state
                t0 = time.monotonic()
                sync.save(root / f"sync-{i}", args=ocp.args.StandardSave(state))
                saved += time.monotonic() - t0
                step()
            manager = ocp.CheckpointManager(root / "managed", options=ocp.CheckpointManagerOptions(max_to_keep=2))
            for i in range(SAVES):
                t0 = time.monotonic()
                manager.save(i, args=ocp.args.StandardSave(state))  # blocks for the copy, writes in the background
                saved += time.monotonic() - t0
                step()
                step()
            manager.wait_until_finished()  # not a blocking save: Orbax records no event for it
            step()
            for _ in range(2):
                t0 = time.monotonic()
                got = sync.restore(root / f"sync-{SAVES - 1}", args=ocp.args.StandardRestore(abstract))
                restored += time.monotonic() - t0
                assert np.array_equal(got["m"], written["m"])  # what the last synchronous save wrote
                step()
                t0 = time.monotonic()
                manager.restore(SAVES - 1, args=ocp.args.StandardRestore(abstract))
                restored += time.monotonic() - t0
                step()
            manager.close()
            answer(
                saved=saved,
                restored=restored,
                orbax_saved=orbax["saved"],
                orbax_restored=orbax["restored"],
                steps=number,
            )
        elif cmd == "exit":
            break
    exporter.stop()
    answer(stopped=True)


if __name__ == "__main__":
    main()
