"""Time to read a profile and split each device's time (jaxmon.xla.profile, issue 34 groundwork), and how long the
parse keeps a training thread from the GIL.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python bench/profile_parse.py      # about a minute

Two traces:
- `cpu`: a real 2-step trace (`jax.profiler.start_trace`/`stop_trace`) of a sharded 4-layer MLP step on the 8 CPU
  devices under Mesh(("data", "model"), (4, 2)), its gradient all-reduced over "data": what a CPU job's sample is.
  Also reported: the start and stop of the trace, and jaxlib's own parser on the same bytes
  (`jax.profiler.ProfileData.from_serialized_xspace`, then walking every event and its stats, as a reader must).
- `gpu`: a synthetic GPU host (tests/xspace_fakes.py's layout) of 8 devices with --gpu-events kernels and memcpys
  in all on three streams each (compute, NCCL, copies), plus what a reader skips: derived `XLA Ops` lines repeating
  every kernel and a host plane with a launch event per kernel.

For each: the median of --repeats of `read()` (parse and classify) and of `Trace.split()`, and the GIL: while a
background thread parses (as jaxmon will, off the training thread), the main thread plays a trainer that sleeps
1 ms at a time; its wake-up latency beyond the 1 ms (max and p99) is how long it waited for the GIL. The same
without a parse is the baseline. A pure-Python parse hands the GIL over at the interpreter's switch interval
(`sys.getswitchinterval()`, 5 ms); a C call holding the GIL blocks the trainer for the whole call.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from common import ROOT, save
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmon.xla.profile import read
from jaxmon.xla.xspace import parse
from tests.xspace_fakes import Kernel, gpu_space

assert ROOT  # bench/common.py puts the repository on sys.path


def cpu_trace() -> tuple[bytes, dict[str, float]]:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    layers = [jax.device_put(jnp.full((512, 512), 0.01), NamedSharding(mesh, P())) for _ in range(4)]
    x = jax.device_put(jnp.ones((256, 512)), NamedSharding(mesh, P("data")))

    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)

    @jax.jit
    def step(ws: list[jax.Array], x: jax.Array) -> list[jax.Array]:
        return [w - 0.01 * g for w, g in zip(ws, jax.grad(loss)(ws, x), strict=True)]

    layers = step(layers, x)
    jax.block_until_ready(layers)
    with TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        jax.profiler.start_trace(tmp)
        t1 = time.perf_counter()
        for _ in range(2):
            layers = step(layers, x)
        jax.block_until_ready(layers)
        t2 = time.perf_counter()
        jax.profiler.stop_trace()
        t3 = time.perf_counter()
        [path] = Path(tmp).glob("plugins/profile/*/*.xplane.pb")
        data = path.read_bytes()
    return data, {"start_trace_s": t1 - t0, "two_steps_s": t2 - t1, "stop_trace_s": t3 - t2}


def gpu_trace(events: int) -> bytes:
    per_device = events // 8
    devices: dict[int, list[Kernel]] = {}
    for d in range(8):
        kernels = []
        t = 0.0
        for i in range(per_device):
            kind = i % 10
            if kind < 7:
                kernels.append(Kernel(7, f"loop_fusion_{i % 50}", t, t + 3, hlo_op=f"fusion.{i % 50}"))
                t += 3.5
            elif kind < 9:
                kernels.append(
                    Kernel(
                        13,
                        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                        t - 3,
                        t + 4,
                        hlo_op=f"all-reduce-start.{i % 20}",
                    )
                )
                t += 1
            else:
                kernels.append(
                    Kernel(14, "MemcpyD2H", t - 2, t + 1, memcpy="kind_src:device kind_dst:pinned num_bytes:65536")
                )
        devices[d] = kernels
    return gpu_space(devices, profile_us=int(t) + 10)


def events_of(data: bytes) -> int:
    return sum(len(line) for plane in parse(data).planes for line in plane.lines)


def jaxlib_walk(data: bytes) -> int:
    n = 0
    for plane in jax.profiler.ProfileData.from_serialized_xspace(data).planes:
        for line in plane.lines:
            for event in line.events:
                n += len(dict(event.stats)) + 1
    return n


def median_seconds(fn: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def gc_pauses(fn: Callable[[], Any]) -> dict[str, float]:
    """The garbage collections `fn` set off (each holds the GIL throughout): how many, and the longest."""
    pauses: list[float] = []
    began = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - began[0])

    gc.callbacks.append(callback)
    try:
        fn()
    finally:
        gc.callbacks.remove(callback)
    return {"collections": len(pauses), "longest_ms": round(max(pauses, default=0.0) * 1e3, 2)}


def trainer_latency(work: Callable[[], Any] | None, seconds: float = 0.0) -> dict[str, float]:
    """Wake-up latencies (beyond the 1 ms sleep) of this thread while `work` runs in another (or for `seconds`)."""
    done = threading.Event()
    worker = None
    if work is not None:

        def run() -> None:
            try:
                work()
            finally:
                done.set()

        worker = threading.Thread(target=run)
        worker.start()
    else:
        threading.Timer(seconds, done.set).start()
    lat = []
    while not done.is_set():
        t0 = time.perf_counter()
        time.sleep(0.001)
        lat.append(time.perf_counter() - t0 - 0.001)
    if worker is not None:
        worker.join()
    lat.sort()
    return {
        "wakeups": len(lat),
        "max_ms": round(lat[-1] * 1e3, 2) if lat else 0.0,
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2) if lat else 0.0,
        "median_ms": round(statistics.median(lat) * 1e3, 3) if lat else 0.0,
    }


def measure(name: str, data: bytes, repeats: int) -> dict[str, Any]:
    trace = read(data)
    out: dict[str, Any] = {
        "bytes": len(data),
        "events": events_of(data),
        "devices": len(trace.devices),
        "read_s_median": round(median_seconds(lambda: read(data), repeats), 4),
        "read_cpu_s_median": round(median_seconds(lambda: read(data), repeats, time.process_time), 4),
        "read_gc": gc_pauses(lambda: read(data)),
        "split_s_median": round(median_seconds(trace.split, repeats), 4),
        "jaxlib_parse_s_median": round(
            median_seconds(lambda: jax.profiler.ProfileData.from_serialized_xspace(data), repeats), 4
        ),
        "jaxlib_parse_and_walk_s_median": round(median_seconds(lambda: jaxlib_walk(data), repeats), 4),
        "trainer_latency_idle": trainer_latency(None, 1.0),
        "trainer_latency_during_read": trainer_latency(lambda: [read(data).split() for _ in range(3)]),
        "trainer_latency_during_jaxlib_parse": trainer_latency(
            lambda: [jax.profiler.ProfileData.from_serialized_xspace(data) for _ in range(3)]
        ),
    }
    print(f"{name}: {out}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu-events", type=int, default=100_000)
    args = ap.parse_args()
    cpu_data, trace_cost = cpu_trace()
    cpu = measure("cpu", cpu_data, args.repeats)
    cpu.update({k: round(v, 4) for k, v in trace_cost.items()})
    t0 = time.perf_counter()
    gpu_data = gpu_trace(args.gpu_events)
    print(f"built the synthetic GPU trace in {time.perf_counter() - t0:.1f} s", flush=True)
    gpu = measure("gpu", gpu_data, args.repeats)
    save(
        "profile_parse",
        {
            "command": "JAX_NUM_CPU_DEVICES=8 python bench/profile_parse.py",
            "switch_interval_s": sys.getswitchinterval(),
            "cpu_2_step_trace": cpu,
            "gpu_synthetic_trace": gpu,
        },
    )


if __name__ == "__main__":
    main()
