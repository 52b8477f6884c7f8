"""Cost of one scrape as devices grow: 8, 64 and 256 replayed devices.

    .venv/bin/python bench/scrape_cost.py          # about 1 minute; writes bench/results/replay/*.json too

Replay files are generated (bench/results/replay/devices-N.json): N GPU devices of the BFC shape with every
`memory_stats()` key, each a list of 64 different dicts, so every poll brings new numbers (the worst case for
any caching). The figure is the cost of a scrape that has to render: the scrape right after a poll changed the
snapshot (later scrapes of the same snapshot are served from the cached bytes). Measured in-process on the
server's own code path: the runtime `jaxmon.compose.build_runtime` builds on the replay file, `update_all_once()`, then
`jaxmon.exposition.Exposition.render()` timed (with the process_* families it reads per scrape), plain and with
gzip (what Prometheus asks for), median of 60 polls. Interleaved with it, the same snapshot rendered by
prometheus_client's `generate_latest` over a registry holding the same families (what jaxmon did before) for
the before/after comparison; the two outputs are checked to be byte-identical up to the process_* families
(and, first, on 300 random sets of families with awkward labels and values). A second row adds the probe's 12
series per device (a live host with N devices probes each of them; replayed devices run no probe).
Over HTTP: the daemon serving each replay file, 300 sequential keep-alive gzip scrapes, median and p99.
Target: linear in devices, <= 10 ms at 256.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import time
from pathlib import Path
from typing import Any

from common import RESULTS, Jaxmon, median, running, save, wait_ready
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from jaxmon.collectors.base import AnyCollector, Update, standalone_context
from jaxmon.collectors.probe import ProbeCollector, ProbeOptions, ProbeState
from jaxmon.compose import build_runtime, load_settings, make_source
from jaxmon.device_readings import ProbeStatus
from jaxmon.exposition import Exposition, snapshot_families
from jaxmon.logsetup import configure_logging
from jaxmon.snapshot import Snapshot
from jaxmon.text_format import TextFormat

GiB = 2**30


def stats_entry(rng: random.Random) -> dict[str, int]:
    limit = 64 * GiB
    pool = rng.randrange(limit // 4, limit)
    in_use = rng.randrange(0, pool)
    return {
        "num_allocs": rng.randrange(1, 10**7),
        "bytes_in_use": in_use,
        "peak_bytes_in_use": rng.randrange(in_use, pool + 1),
        "largest_alloc_size": rng.randrange(1, 4 * GiB),
        "bytes_reserved": 0,
        "peak_bytes_reserved": 0,
        "largest_free_block_bytes": rng.randrange(0, pool - in_use + 1),
        "bytes_limit": limit,
        "pool_bytes": pool,
        "peak_pool_bytes": pool,
    }


def write_replay(n: int, directory: Path, entries: int = 64) -> Path:
    rng = random.Random(n)
    devices = [
        {
            "id": i,
            "platform": "gpu",
            "device_kind": "NVIDIA H100 80GB HBM3",
            "process_index": 0,
            "memory_stats": [stats_entry(rng) for _ in range(entries)],
        }
        for i in range(n)
    ]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"devices-{n}.json"
    path.write_text(json.dumps({"devices": devices}))
    return path


class ReplayRuntime:
    """The daemon's runtime on a replay file, polled by hand; with `probes`, random probe statuses every poll."""

    # Replayed devices run no probe: a live host's probe collector is stood in for by recording its state here and
    # rendering it with a ProbeCollector built without devices of its own (so no worker threads).

    def __init__(self, path: Path, probes: bool = False) -> None:
        settings = load_settings(["--replay", str(path)])
        self.runtime = build_runtime(settings)
        self.collectors: list[AnyCollector] = list(self.runtime.collectors)
        self._probes = probes
        if probes:
            ctx = standalone_context(make_source(settings))
            self.collectors.append(ProbeCollector(ProbeOptions(), ctx))
        self._rng = random.Random(0)

    def poll(self) -> None:
        self.runtime.update_all_once()
        if not self._probes:
            return
        r = self._rng
        statuses = {
            d.key: ProbeStatus(
                calibrated=True,
                up=True,
                steps=r.randrange(1, 64),
                last_duration_seconds=r.uniform(0.001, 0.003),
                baseline_seconds=r.uniform(0.001, 0.002),
                utilization_ratio=r.random(),
                flops_per_second=r.uniform(1e12, 1e14),
                footprint_bytes=786432,
                runs_total=r.randrange(1000),
                busy_seconds_total=r.uniform(0, 100),
            )
            for d in self.runtime.snapshot().devices
        }
        self.runtime.record("probe", Update(ProbeState(statuses)), 0.0)

    def snapshot(self) -> Snapshot:
        return self.runtime.snapshot()

    def stop(self) -> None:
        self.runtime.stop()
        for c in self.collectors:
            c.stop()


class Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def check_text_format(trials: int = 300) -> None:
    """TextFormat writes what generate_latest writes: random families with awkward names, labels and values,
    counters with `_created` samples, timestamps, info and histogram families; one TextFormat across all trials,
    so its caches are exercised too."""
    rng = random.Random(6)
    values = [0.0, -0.0, 1, 1.0, True, False, float("nan"), float("inf"), -float("inf"), 2**53 + 1, 10**20, 1e16,
              123456789.0, 1234567.5, 0.1, 1e-7, -5.5, 21474836480]  # fmt: skip
    texts = ["a", "", 'x"y', "back\\slash", "new\nline", "ünï", "{}=,"]
    fmt = TextFormat()
    for _ in range(trials):
        families: list[Metric] = []
        for k in range(rng.randint(0, 6)):
            kind = rng.choice(["gauge", "counter"])
            m = Metric(f"m{k}_x", rng.choice(["help", "he\\lp\nx", ""]), kind)
            name = m.name + ("_total" if kind == "counter" else "")
            for _ in range(rng.randint(0, 5)):
                labels = {rng.choice(["b", "a", "device", "zz"]): rng.choice(texts) for _ in range(rng.randint(0, 3))}
                r = rng.random()
                if r < 0.05:
                    m.add_sample(m.name + "_created", labels, 5.0)
                elif r < 0.08:
                    m.add_sample(name, labels, rng.choice(values), timestamp=12.5)
                else:
                    m.add_sample(name, labels, rng.choice(values))
            families.append(m)
        if rng.random() < 0.2:
            families.append(InfoMetricFamily("build", "x", value={"a": "b"}))
        if rng.random() < 0.2:
            families.append(HistogramMetricFamily("h", "x", buckets=[("1", 1), ("+Inf", 2)], sum_value=3))
        if fmt.render(iter(families)) != generate_latest(Families(families)):
            raise AssertionError(f"TextFormat differs from generate_latest on {families}")
    print(f"TextFormat == generate_latest on {trials} random sets of families")


class SnapshotFamilies:
    """A prometheus_client collector of every jaxmon family of the current snapshot (for generate_latest)."""

    def __init__(self, source: ReplayRuntime) -> None:
        self._source = source

    def collect(self) -> list[Metric]:
        return snapshot_families(self._source.snapshot(), self._source.collectors, None)


def measure(source: ReplayRuntime, polls: int) -> dict[str, float]:
    """Interleaved: new snapshot -> Exposition.render (plain, then gzip, then cached) and generate_latest."""
    exposition = Exposition(source.snapshot, source.collectors)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotFamilies(source))
    plain, gz, cached, before = [], [], [], []
    size = 0
    for i in range(polls + 3):
        source.poll()
        t0 = time.perf_counter()
        body = exposition.render(want_gzip=False)
        t1 = time.perf_counter()
        exposition.render(want_gzip=True)
        t2 = time.perf_counter()
        exposition.render(want_gzip=True)
        t3 = time.perf_counter()
        old = generate_latest(registry)
        t4 = time.perf_counter()
        # The body is the snapshot's families, then the process_* ones read per scrape (generate_latest has not
        # got those: the registry holds only the snapshot's).
        if not body.startswith(old) or not body[len(old) :].startswith(b"# HELP process_"):
            raise AssertionError("Exposition.render differs from generate_latest")
        if i >= 3:  # the first renders fill caches and warm up the interpreter
            plain.append(t1 - t0)
            gz.append(t2 - t1)
            cached.append(t3 - t2)
            before.append(t4 - t3)
            size = len(body)
    return {
        "render_s": median(plain),
        "gzip_s": median(gz),
        "scrape_after_poll_s": median([p + g for p, g in zip(plain, gz, strict=True)]),
        "cached_scrape_s": median(cached),
        "generate_latest_s": median(before),
        "body_bytes": size,
    }


def http_latency(path: Path, scrapes: int) -> dict[str, float]:
    daemon = Jaxmon(["--replay", str(path)], name=f"cost-{path.stem}")
    with running(daemon):
        wait_ready(daemon, daemon.url)
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        lat = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            resp.read()
            lat.append(time.perf_counter() - t0)
            time.sleep(0.01)
        conn.close()
    lat.sort()
    return {"http_median_s": median(lat), "http_p99_s": lat[int(0.99 * (len(lat) - 1))]}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, r^2)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, 1 - ss_res / ss_tot if ss_tot else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--polls", type=int, default=60)
    ap.add_argument("--scrapes", type=int, default=300)
    args = ap.parse_args()

    configure_logging("warning")  # build_runtime's start-up lines would bury the figures
    check_text_format()
    rows: dict[str, dict[str, float]] = {}
    for n in args.devices:
        path = write_replay(n, RESULTS / "replay")
        sources = ReplayRuntime(path), ReplayRuntime(path, probes=True)
        try:
            memory_only = measure(sources[0], args.polls)
            with_probes = measure(sources[1], args.polls)
        finally:
            for source in sources:
                source.stop()
        row = {**memory_only, **{f"with_probes_{k}": v for k, v in with_probes.items()}}
        row.update(http_latency(path, args.scrapes))
        rows[str(n)] = row
        print(
            f"{n:4} devices: scrape after a poll {row['scrape_after_poll_s'] * 1e3:6.2f} ms"
            f" (render {row['render_s'] * 1e3:.2f} + gzip {row['gzip_s'] * 1e3:.2f};"
            f" generate_latest was {row['generate_latest_s'] * 1e3:.2f}); with probe series"
            f" {row['with_probes_scrape_after_poll_s'] * 1e3:.2f} ms; cached {row['cached_scrape_s'] * 1e6:.1f} us;"
            f" HTTP median {row['http_median_s'] * 1e3:.2f} ms p99 {row['http_p99_s'] * 1e3:.2f} ms;"
            f" {row['body_bytes']} bytes",
            flush=True,
        )
    xs = [float(n) for n in args.devices]
    result: dict[str, Any] = {"command": "python bench/scrape_cost.py", "devices": rows}
    for key in ("scrape_after_poll_s", "with_probes_scrape_after_poll_s", "generate_latest_s"):
        a, b, r2 = fit(xs, [rows[str(n)][key] for n in args.devices])
        result[f"fit_{key}"] = {"fixed_ms": a * 1e3, "per_device_ms": b * 1e3, "r2": r2}
        print(f"{key}: {a * 1e3:.3f} ms + {b * 1e3:.4f} ms/device (r^2 {r2:.4f})")
    largest = str(max(args.devices))
    fit_now = result["fit_scrape_after_poll_s"]
    result["met"] = rows[largest]["scrape_after_poll_s"] <= 0.010 and fit_now["r2"] >= 0.99
    save("scrape_cost", result)


if __name__ == "__main__":
    main()
