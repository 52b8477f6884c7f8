"""The baseline: a plain prometheus_client exporter doing jaxmon's job the way most exporters are written.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python bench/baseline_exporter.py --port 10402 [--no-probe]

Gauges and Counters set from polling loops, served by prometheus_client's `start_http_server` (a threading
HTTP/1.0 server; every scrape collects and renders the registry again). It exports the same series as jaxmon on
the same devices, under the same names and HELP texts (taken from jaxmon.collectors.memory and
jaxmon.collectors.probe so the bodies are the same size): `memory_stats()` of every device every 5 s, and a
probe-equivalent (a jit-compiled `tanh(x @ w)` chain of 256 x 256 float32, placed on each device, calibrated to
about 2 ms, one device every 15 s / N, staggered). Its own registry holds only these metrics (no
process/platform/GC collectors), and `_created` samples are off, as in jaxmon. `--no-probe` leaves the probe out:
then it is only "a prometheus_client exporter that imports JAX and polls memory_stats()".
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import threading
import time
from importlib import metadata
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, start_http_server

from jaxmon.catalog import metrics
from jaxmon.families.memory import MEMORY_METRICS

disable_created_metrics()
REG = CollectorRegistry(auto_describe=False)
DEV = ["device", "platform"]


def gauge(name: str, help_text: str, labels: list[str] | None = None) -> Gauge:
    return Gauge(name, help_text, labels if labels is not None else DEV, registry=REG)


def counter(name: str, help_text: str, labels: list[str] | None = None) -> Counter:
    return Counter(name, help_text, labels if labels is not None else DEV, registry=REG)


HELP = {f.name: f.help for f in metrics.FAMILIES}

build = gauge(
    "jaxmon_build_info", "Versions; always 1.", ["version", "jax_version", "jaxlib_version", "python_version"]
)
backend_up = gauge("jaxmon_backend_up", "1 when the JAX backend initialised.", ["backend"])
device_info = gauge(
    "jaxmon_device_info",
    "Identity of each device; always 1.",
    ["device", "platform", "device_kind", "process_index", "coords", "core_on_chip", "source"],
)
supported = gauge("jaxmon_memory_stats_supported", "1 when the device's allocator reports memory_stats().")
read_ok = gauge("jaxmon_memory_read_success", "1 when the last memory_stats() call succeeded.")
read_errors = counter("jaxmon_memory_read_errors", "memory_stats() calls that raised.")
memory = {
    m.field: (counter if m.family.counter else gauge)(m.family.name, m.family.help) for m in MEMORY_METRICS
}  # filled only where memory_stats() returns a dict
RAW = {
    "bytes_in_use": "bytes_in_use",
    "peak_bytes_in_use": "peak_bytes_in_use",
    "limit_bytes": "bytes_limit",
    "pool_bytes": "pool_bytes",
    "largest_free_block_bytes": "largest_free_block_bytes",
    "largest_alloc_bytes": "largest_alloc_size",
}
up = gauge("jaxmon_device_up", HELP["jaxmon_device_up"])
util = gauge("jaxmon_device_utilization_ratio", HELP["jaxmon_device_utilization_ratio"])
duration = gauge("jaxmon_probe_duration_seconds", HELP["jaxmon_probe_duration_seconds"])
baseline_g = gauge("jaxmon_probe_baseline_seconds", HELP["jaxmon_probe_baseline_seconds"])
flops = gauge("jaxmon_probe_flops_per_second", HELP["jaxmon_probe_flops_per_second"])
footprint = gauge("jaxmon_probe_memory_bytes", HELP["jaxmon_probe_memory_bytes"])
steps_g = gauge("jaxmon_probe_steps", HELP["jaxmon_probe_steps"])
runs = counter("jaxmon_probe_runs", HELP["jaxmon_probe_runs"])
failures = counter("jaxmon_probe_failures", HELP["jaxmon_probe_failures"])
timeouts = counter("jaxmon_probe_timeouts", HELP["jaxmon_probe_timeouts"])
skipped = counter("jaxmon_probe_skipped", HELP["jaxmon_probe_skipped"])
busy = counter("jaxmon_probe_busy_seconds", HELP["jaxmon_probe_busy_seconds"])
c_success = gauge("jaxmon_collector_success", "1 when the collector's last run got all its data.", ["collector"])
c_duration = gauge("jaxmon_collector_duration_seconds", "Time of the collector's last run.", ["collector"])
c_last = gauge("jaxmon_collector_last_success_timestamp_seconds", "Unix time of the last success.", ["collector"])


def labels(dev: Any) -> dict[str, str]:
    return {"device": str(dev.id), "platform": str(dev.platform)}


def poll_loop(devices: list[Any], interval: float) -> None:
    while True:
        started = time.perf_counter()
        ok = True
        for dev in devices:
            lab = labels(dev)
            read_errors.labels(**lab)  # the series exists at 0
            try:
                stats = dev.memory_stats()
            except Exception:
                read_errors.labels(**lab).inc()
                read_ok.labels(**lab).set(0)
                ok = False
                continue
            read_ok.labels(**lab).set(1)
            supported.labels(**lab).set(0 if stats is None else 1)
            if stats is None:
                continue
            for fld, raw in RAW.items():
                value = stats.get(raw, -1)
                if value is not None and value >= 0:
                    memory[fld].labels(**lab).set(value)
            if stats.get("bytes_limit", -1) >= 0 and stats.get("bytes_in_use", -1) >= 0:
                memory["free_bytes"].labels(**lab).set(stats["bytes_limit"] - stats["bytes_in_use"])
        c_success.labels("memory").set(1 if ok else 0)
        c_duration.labels("memory").set(time.perf_counter() - started)
        if ok:
            c_last.labels("memory").set(time.time())
        time.sleep(max(interval - (time.perf_counter() - started), 0.0))


class Probe:
    """tanh(x @ w) chained `steps` times in one compiled fori_loop on one device."""

    def __init__(self, dev: Any, size: int, target: float) -> None:
        rng = np.random.default_rng(0)
        self.x = jax.device_put(rng.standard_normal((size, size), dtype=np.float32), dev)
        self.w = jax.device_put((rng.standard_normal((size, size), dtype=np.float32) / np.sqrt(size)), dev)
        self.dev = dev

        def chain(x: Any, w: Any, n: Any) -> Any:
            return jax.lax.fori_loop(0, n, lambda _, c: jnp.tanh(c @ w), x)

        self.fn = jax.jit(chain).lower(self.x, self.w, jax.device_put(np.int32(1), dev)).compile()
        mem = self.fn.memory_analysis()
        self.footprint = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
        self.time(1)
        one = statistics.median(self.time(1) for _ in range(5))
        self.steps = min(max(math.ceil(target / max(one, 1e-7)), 1), 4096)
        self.n = jax.device_put(np.int32(self.steps), dev)
        self.samples = [self.time() for _ in range(7)]
        self.calibration = statistics.median(self.samples)

    def time(self, n: int | None = None) -> float:
        arg = self.n if n is None else jax.device_put(np.int32(n), self.dev)
        start = time.perf_counter()
        self.fn(self.x, self.w, arg).block_until_ready()
        return time.perf_counter() - start


def probe_loop(devices: list[Any], interval: float, size: int, target: float) -> None:
    probes = {}
    for dev in devices:
        p = Probe(dev, size, target)
        probes[dev.id] = p
        lab = labels(dev)
        footprint.labels(**lab).set(p.footprint)
        steps_g.labels(**lab).set(p.steps)
        busy.labels(**lab).inc(sum(p.samples))
        for c in (failures, timeouts, skipped):
            c.labels(**lab)
    gap = interval / max(len(devices), 1)
    while True:
        round_time = 0.0
        for dev in devices:
            p, lab = probes[dev.id], labels(dev)
            latency = p.time()
            p.samples = [*p.samples[-119:], latency]
            base = min(p.calibration, sorted(p.samples)[max(math.ceil(0.1 * len(p.samples)), 1) - 1])
            runs.labels(**lab).inc()
            busy.labels(**lab).inc(latency)
            up.labels(**lab).set(1)
            duration.labels(**lab).set(latency)
            baseline_g.labels(**lab).set(base)
            util.labels(**lab).set(min(max(1 - base / latency, 0.0), 1.0))
            flops.labels(**lab).set(2 * size**3 * p.steps / latency)
            round_time += latency
            c_success.labels("probe").set(1)
            c_duration.labels("probe").set(round_time)
            c_last.labels("probe").set(time.time())
            time.sleep(gap)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=10402)
    ap.add_argument("--poll-interval", type=float, default=5.0)
    ap.add_argument("--probe-interval", type=float, default=15.0)
    ap.add_argument("--probe-size", type=int, default=256)
    ap.add_argument("--no-probe", action="store_true")
    args = ap.parse_args()

    devices = jax.local_devices()
    build.labels(
        metadata.version("jaxmon"), jax.__version__, metadata.version("jaxlib"), platform.python_version()
    ).set(1)
    for name in sorted({d.platform for d in devices}):
        backend_up.labels(name).set(1)
    for d in devices:
        device_info.labels(str(d.id), d.platform, d.device_kind, str(d.process_index), "", "", "local").set(1)
    threading.Thread(target=poll_loop, args=(devices, args.poll_interval), daemon=True).start()
    if not args.no_probe:
        threading.Thread(
            target=probe_loop, args=(devices, args.probe_interval, args.probe_size, 0.002), daemon=True
        ).start()
    start_http_server(args.port, addr="127.0.0.1", registry=REG)
    print(f"baseline exporter on 127.0.0.1:{args.port}, {len(devices)} devices", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
