"""A small JAX training loop run as a real child process by the workload tests.

Usage: train.py MODE [--port P] [--spool DIR] [--workload NAME] [--interval S]
MODE is `embedded` (jaxmon.start), `publish` (jaxmon.publish) or `none`. Commands on stdin, one per line; each is
answered on stdout with `OK <json>`:
  alloc DEVICE NBYTES      keep a float32 array of NBYTES on device DEVICE alive
  shard NBYTES             keep an NBYTES array sharded evenly over all devices alive
  replicate NBYTES         keep an NBYTES array fully replicated over all devices alive (NBYTES on each)
  offload KIND NBYTES      keep an NBYTES array in host memory kind KIND (pinned_host, unpinned_host), sharded
                           evenly over all devices, alive
  compile K                jit-compile K new functions (K backend compilations)
  recompile                clear JAX's in-memory caches and call every compiled function again (with a
                           persistent compilation cache configured, each is a cache hit)
  train N                  run N training steps, answer with the median step time
  steps N [DATA_MS] [ALL]  run N training steps reported with jaxmon.step() (numbered on from the last), each synced
                           by this loop after step() (then waiting for jaxmon's waiter to book it), with DATA_MS of
                           badput("data") before each; answer with the
                           loop's own completion times (time.monotonic), how long each data block took as it
                           measured it, and the step program's XLA FLOPs (ALL 1: each step followed by an
                           all-reduce of a small array over every device); with the times (monotonic and Unix)
                           just before and just after jaxmon.start() or publish() and the Unix time of the
                           last completion
  losses N                 N steps (numbered on), each handing jaxmon.step(n, loss) a scalar float32 array of
                           1 / (n + 1) (put on the device, nothing compiled), synced and booked
  restore N                number the next `steps` from N (as a restart from a checkpoint of step N does)
  restart-exporter         (embedded) jaxmon.stop(), then jaxmon.start() again on the same port and settings
  checkpointed N           jaxmon.checkpointed(N): a checkpoint of step N, taken now
  hold KIND                open a `jaxmon.badput(KIND)` block and leave it open
  release                  close it; answer with the seconds it was open, as this loop timed it
  collective N             N steps (numbered on) of a tracked program that all-reduces a replicated gradient over
                           the "data" axis of a ("data", "model") mesh of every device, each synced and booked; the
                           first is followed by a wait for jaxmon's analysis of the program (so that the rest count
                           its collective bytes)
  loop N WITH_STEP [SIZE]  an asynchronous loop of N steps of a SIZE x SIZE matmul step (256; synced only at the
                           end), with jaxmon.step(n, loss) each step when WITH_STEP is 1; answer with the wall time
                           and the median time of one jaxmon.step() call on this thread
  cpu N WITH_STEP          N tiny steps, each synced and followed by 0.3 ms of sleep (the cores stay free), with
                           jaxmon.step(n, out) each step when WITH_STEP is 1; answer with this process's CPU time
                           per step (the waiter's included: measured 0.5 s after the last step)
  exit
With --train-forever the loop trains until killed and prints `STEP n` lines instead of reading stdin.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
import jaxmon.training
from jaxmon.logsetup import configure_logging
from tests.workloads.protocol import answer, booked

kept: list[jax.Array] = []
placed: list[jax.Array] = []  # replicated and host-memory arrays, apart from `kept` (whose first `compile` uses)


def make_step() -> tuple[object, dict[str, jax.Array], jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((256, 64), dtype=np.float32))
    y = x @ jnp.asarray(rng.standard_normal((64, 1), dtype=np.float32))
    params = {"w": jnp.zeros((64, 1)), "b": jnp.zeros((1,))}

    def loss(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    @jax.jit
    def step(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> dict[str, jax.Array]:
        g = jax.grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g)

    return step, params, x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["embedded", "publish", "none"])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--spool")
    ap.add_argument("--workload")
    ap.add_argument("--interval", type=float, default=0.3)
    ap.add_argument("--train-forever", action="store_true")
    ap.add_argument("--alloc", type=int, default=0, help="bytes to keep alive on device 0 at start")
    ap.add_argument("--peak-flops", type=float, help="collector.training.peak_flops (per device)")
    ap.add_argument("--profile-every", type=int, help="collector.training.profile.every (with profile.steps 1)")
    ap.add_argument("--link-bandwidth", default="", help="collector.training.link_bandwidth (link=bytes/s,...)")
    ap.add_argument("--checkpoint-interval", help="collector.checkpoint.interval and interval_steps: 30m,100")
    args = ap.parse_args()
    collector: dict[str, object] = {}
    if args.checkpoint_interval:
        every, steps = args.checkpoint_interval.split(",")
        collector["checkpoint"] = {"interval": every, "interval_steps": int(steps)}
    training: dict[str, object] = {"peak_flops": args.peak_flops} if args.peak_flops else {}
    if args.link_bandwidth:
        training["link_bandwidth"] = args.link_bandwidth
    if args.profile_every is not None:
        training["profile"] = {"every": args.profile_every, "steps": 1, "min_seconds": 0}
    configure_logging("info", "json", stream=sys.stderr)

    if args.alloc:
        kept.append(jax.device_put(np.zeros(args.alloc // 4, np.float32), jax.devices()[0]))
    handle: object = None
    # The loop's own clocks around the start of jaxmon (its tracker starts in between).
    started = {"monotonic": [time.monotonic()], "unix": [time.time()]}
    if args.mode == "embedded":
        exporter = jaxmon.start(args.port, workload=args.workload, poll={"interval": args.interval}, training=training)
        handle = exporter
        answer(url=exporter.url, pid=os.getpid())
    elif args.mode == "publish":
        handle = jaxmon.publish(
            args.spool, workload=args.workload, interval=args.interval, training=training, collector=collector
        )
        answer(pid=os.getpid())
    else:
        answer(pid=os.getpid())
    started["monotonic"].append(time.monotonic())
    started["unix"].append(time.time())

    step, params, x, y = make_step()
    spread = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), PartitionSpec("d"))
    all_sum = jax.jit(jnp.sum)
    if args.train_forever:
        n = 0
        while True:
            params = step(params, x, y)  # type: ignore[operator]
            jax.block_until_ready(params)
            n += 1
            if n % 50 == 0:
                print(f"STEP {n}", flush=True)
            time.sleep(0.002)

    compiled = 0
    functions: list[Any] = []
    tracked: Any = jaxmon.track(step)  # type: ignore[arg-type]
    number = 0
    held: tuple[Any, float] = (None, 0.0)  # the badput() block `hold` opened, and when
    heavy = jax.jit(lambda a, b: (jnp.tanh(a @ b), jnp.sum(a)))
    tiny = jax.jit(lambda a: a * 1.0001)
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "alloc":
            device, nbytes = int(rest[0]), int(rest[1])
            kept.append(jax.device_put(np.ones(nbytes // 4, np.float32), jax.devices()[device]))
            answer()
        elif cmd == "shard":
            nbytes = int(rest[0])
            mesh = Mesh(np.array(jax.devices()), ("d",))
            kept.append(jax.device_put(np.ones(nbytes // 4, np.float32), NamedSharding(mesh, PartitionSpec("d"))))
            answer()
        elif cmd in ("replicate", "offload"):
            mesh = Mesh(np.array(jax.devices()), ("d",))
            nbytes = int(rest[-1])
            if cmd == "replicate":
                where = NamedSharding(mesh, PartitionSpec())
            else:
                where = NamedSharding(mesh, PartitionSpec("d"), memory_kind=rest[0])
            placed.append(jax.device_put(np.ones(nbytes // 4, np.float32), where))
            answer()
        elif cmd == "compile":
            for _ in range(int(rest[0])):
                compiled += 1
                # A fresh function object each time: a new jit cache entry, one backend compilation.
                fn = jax.jit(lambda v, c=compiled: v * c + c)
                functions.append(fn)
                jax.block_until_ready(fn(kept[0] if kept else jnp.ones(4)))
            answer(compiled=compiled)
        elif cmd == "recompile":
            jax.clear_caches()
            for fn in functions:
                jax.block_until_ready(fn(kept[0] if kept else jnp.ones(4)))
            answer(recompiled=len(functions))
        elif cmd == "train":
            times = []
            for _ in range(int(rest[0])):
                start = time.perf_counter()
                params = step(params, x, y)  # type: ignore[operator]
                jax.block_until_ready(params)
                times.append(time.perf_counter() - start)
            answer(median=statistics.median(times))
        elif cmd == "steps":
            data = float(rest[1]) / 1000 if len(rest) > 1 else 0.0
            collective = len(rest) > 2 and rest[2] == "1"
            done, loads = [], []
            for _ in range(int(rest[0])):
                if data:
                    load = time.monotonic()
                    with jaxmon.badput("data"):
                        time.sleep(data)
                    loads.append(time.monotonic() - load)
                params = tracked(params, x, y)
                jaxmon.step(number, params["b"], examples=256, tokens=2560, model_flops=8e6)
                jax.block_until_ready(params)
                if collective:  # an all-reduce over every device, in the next step's interval
                    # (its input freed at once: the process's live arrays stay the step's), once jaxmon has booked
                    # this step complete: run before that, it would lie before the next step's interval starts
                    booked(number)
                    jax.block_until_ready(all_sum(jax.device_put(np.ones(8 * 1024, np.float32), spread)))
                done.append(time.monotonic())
                done_unix = time.time()
                booked(number)
                number += 1
            flops = step.lower(params, x, y).compile().cost_analysis()["flops"]  # type: ignore[attr-defined]
            (device,) = params["b"].devices()
            answer(done=done, loads=loads, flops=flops, device=int(device.id), started=started, done_unix=done_unix)
        elif cmd == "collective":
            mesh = Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "model"))
            w = jax.device_put(np.ones((64, 64), np.float32), NamedSharding(mesh, PartitionSpec()))
            batch = jax.device_put(np.ones((32, 64), np.float32), NamedSharding(mesh, PartitionSpec("data")))
            reduce = jaxmon.track(jax.jit(lambda w, b: w - 1e-3 * jax.grad(lambda w: jnp.sum(jnp.tanh(b @ w)))(w)))
            for k in range(int(rest[0])):
                w = reduce(w, batch)
                jaxmon.step(number, w)
                jax.block_until_ready(w)
                booked(number)
                number += 1
                tracker = jaxmon.training.current()
                while k == 0 and tracker is not None and not tracker._analyzer.idle():
                    time.sleep(0.01)
            del w, batch, reduce  # no live arrays kept between commands (the memory panels' premise)
            answer(steps=number)
        elif cmd == "loop":
            count, with_step = int(rest[0]), rest[1] == "1"
            size = int(rest[2]) if len(rest) > 2 else 256
            a = b = jnp.ones((size, size)) / size
            calls = []
            start = time.perf_counter()
            for _ in range(count):
                a, loss = heavy(a, b)
                if with_step:
                    t0 = time.perf_counter_ns()
                    jaxmon.step(number, loss)
                    calls.append(time.perf_counter_ns() - t0)
                    number += 1
            jax.block_until_ready(a)
            wall = time.perf_counter() - start
            answer(wall=wall, step_call_ns=statistics.median(calls) if calls else None)
        elif cmd == "cpu":
            count, with_step = int(rest[0]), rest[1] == "1"
            c = tiny(jnp.ones(4)).block_until_ready()
            cpu0 = time.process_time()
            for _ in range(count):
                c = tiny(c)
                if with_step:
                    jaxmon.step(number, c)
                    number += 1
                c.block_until_ready()
                time.sleep(0.0003)
            time.sleep(0.5)  # the waiter books the last steps
            answer(cpu_per_step_us=(time.process_time() - cpu0) / count * 1e6)
        elif cmd == "losses":
            for _ in range(int(rest[0])):
                loss = jax.device_put(np.float32(1.0) / np.float32(number + 1))
                jaxmon.step(number, loss)
                loss.block_until_ready()
                booked(number)
                number += 1
            answer(steps=number)
        elif cmd == "hold":
            held = (jaxmon.badput(rest[0]), time.monotonic())
            held[0].__enter__()
            answer()
        elif cmd == "release":
            block, opened = held
            block.__exit__(None, None, None)
            answer(seconds=time.monotonic() - opened)
        elif cmd == "restore":
            number = int(rest[0])  # as after restoring a checkpoint of that step
            answer(number=number)
        elif cmd == "checkpointed":
            jaxmon.checkpointed(int(rest[0]))
            answer(step=int(rest[0]))
        elif cmd == "restart-exporter":
            jaxmon.stop()
            handle = exporter = jaxmon.start(
                args.port, workload=args.workload, poll={"interval": args.interval}, training=training
            )
            answer(url=exporter.url)
        elif cmd == "exit":
            break
    if handle is not None:
        handle.stop()  # type: ignore[attr-defined]
    answer(stopped=True)


if __name__ == "__main__":
    main()
