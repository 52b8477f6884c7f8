"""Profiles behind BENCHMARKS.md: where a render and where the daemon's CPU go.

    .venv/bin/pip install -e '.[bench]'            # py-spy and pyinstrument
    .venv/bin/python bench/profile.py render [--devices 256]   # pyinstrument: generate_latest vs Exposition.render
    .venv/bin/python bench/profile.py cpu [--window 60]        # CPU per scrape, split by what the daemon does
    .venv/bin/python bench/profile.py probe-idle [--gap 2]     # why an idle CPU device reads as partly busy

`render` profiles 50 renders of a replayed snapshot with N devices (new numbers every poll) through
prometheus_client's generate_latest over a registry (what jaxmon did before) and through jaxmon.exposition.Exposition.

`cpu` runs three daemons side by side on 8 JAX CPU devices, each scraped once a second (gzip, keep-alive) and
idle in alternate windows, and reports CPU (schedstat, ns resolution) per condition and per scrape:
  cached     --no-collector.probe --poll.interval 1h: the snapshot never changes, every scrape is served from
             the cached bytes (what the HTTP server alone costs);
  no_probe   --no-collector.probe: polls every 5 s, a scrape after a poll renders;
  default    polls and probes (8 devices x ~2 ms every 15 s): most scrapes render.
With --flamegraph DIR it also records py-spy flamegraphs of the cached and default daemons while scraped.

`probe-idle` times jaxmon's own probe kernel (JaxProbeKernel, n = 256, the calibrated step count) on an idle CPU
device three ways, interleaved: back to back (as the calibration seeds its baseline), one run every --gap seconds
(as the scheduler runs it), and every --gap seconds right after an untimed 1-step run (the thread pool and caches
woken first). 1 - back-to-back / spaced is the utilization an idle device reads.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import subprocess
import threading
import time
from pathlib import Path

from common import RESULTS, Jaxmon, running, save, sched_seconds, wait_ready


def profile_render(devices: int) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from pyinstrument import Profiler
    from scrape_cost import ReplayRuntime, SnapshotFamilies, write_replay

    from jaxmon.exposition import Exposition
    from jaxmon.logsetup import configure_logging

    configure_logging("warning")  # build_runtime's start-up lines would bury the profile
    source = ReplayRuntime(write_replay(devices, RESULTS / "replay"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotFamilies(source))
    exposition = Exposition(source.snapshot, source.collectors)
    for name, render in (
        ("generate_latest (before)", lambda: generate_latest(registry)),
        ("Exposition.render (now)", lambda: exposition.render(want_gzip=False)),
    ):
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(50):
            source.poll()
            render()
        profiler.stop()
        print(f"===== {name}: 50 renders of {devices} devices")
        print(profiler.output_text(unicode=False, color=False))


def profile_cpu(window: float, flamegraph: Path | None) -> None:
    daemons = {
        "cached": Jaxmon(["--no-collector.probe", "--poll.interval", "1h"], name="profile-cached"),
        "no_probe": Jaxmon(["--no-collector.probe"], name="profile-no-probe"),
        "default": Jaxmon(name="profile-default"),
    }
    results: dict[str, dict[str, float]] = {}
    with running(*daemons.values()):
        for d in daemons.values():
            wait_ready(d, d.url)
        time.sleep(30)  # calibration of the default daemon's probes
        for rate in (0.0, 1.0):
            stop = threading.Event()
            counts = dict.fromkeys(daemons, 0)

            def scraper(name: str, port: int, stop: threading.Event = stop, counts: dict[str, int] = counts) -> None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                next_at = time.monotonic()
                while not stop.is_set():
                    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                    conn.getresponse().read()
                    counts[name] += 1
                    next_at += 1.0
                    stop.wait(max(next_at - time.monotonic(), 0.0))

            before = {n: sched_seconds(d.pid) for n, d in daemons.items()}
            t0 = time.monotonic()
            if rate:
                for n, d in daemons.items():
                    threading.Thread(target=scraper, args=(n, d.port), daemon=True).start()
            spies = []
            if rate and flamegraph is not None and shutil.which("py-spy"):
                flamegraph.mkdir(parents=True, exist_ok=True)
                for n in ("cached", "default"):
                    spies.append(subprocess.Popen(
                        ["py-spy", "record", "-p", str(daemons[n].pid), "-r", "1000", "-d", str(int(window)),
                         "--nonblocking", "-o", str(flamegraph / f"{n}-1-scrape-per-s.svg")],
                    ))  # fmt: skip
            time.sleep(window)
            after = {n: sched_seconds(d.pid) for n, d in daemons.items()}
            wall = time.monotonic() - t0
            stop.set()
            for spy in spies:
                spy.wait(30)
            key = "scraped" if rate else "idle"
            for n in daemons:
                r = results.setdefault(n, {})
                r[f"{key}_cpu_percent"] = 100 * (after[n] - before[n]) / wall
                r[f"{key}_scrapes"] = counts[n]
    for n, r in results.items():
        extra = (r["scraped_cpu_percent"] - r["idle_cpu_percent"]) / 100
        r["cpu_ms_per_scrape"] = 1e3 * extra * window / max(r["scraped_scrapes"], 1)
        print(
            f"{n:9}: idle {r['idle_cpu_percent']:.3f} %, at 1 scrape/s {r['scraped_cpu_percent']:.3f} % of a core;"
            f" {r['cpu_ms_per_scrape']:.2f} ms CPU per scrape"
        )
    save("profile_cpu", {"command": "python bench/profile.py cpu", "window_s": window, "daemons": results})


def profile_probe_idle(gap: float, runs: int) -> None:
    import os
    import statistics

    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    import jax

    from jaxmon.sources.local import JaxProbeKernel

    kernel = JaxProbeKernel(jax, jax.devices("cpu")[0], 256)

    def timed(steps: int) -> float:
        t0 = time.perf_counter_ns()
        kernel.run(steps)
        return (time.perf_counter_ns() - t0) / 1e9

    timed(1)
    one = statistics.median(timed(1) for _ in range(5))
    steps = max(round(0.002 / one), 1)
    b2b, spaced, woken = [], [], []
    for _ in range(runs):
        timed(steps)
        b2b.extend(timed(steps) for _ in range(7))
        time.sleep(gap)
        spaced.append(timed(steps))
        time.sleep(gap)
        kernel.run(1)
        woken.append(timed(steps))
    m = {k: statistics.median(v) for k, v in (("back_to_back", b2b), ("spaced", spaced), ("woken", woken))}
    for k, v in m.items():
        print(f"{k:13}: median {v * 1e3:.3f} ms ({steps} steps)")
    print(
        f"idle device reads {100 * (1 - m['back_to_back'] / m['spaced']):.1f} % busy when runs are spaced,"
        f" {100 * (1 - m['back_to_back'] / m['woken']):.1f} % with an untimed 1-step run first"
    )
    save(
        "profile_probe_idle",
        {"command": f"python bench/profile.py probe-idle --gap {gap}", "steps": steps, "median_s": m, "runs": runs},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("render")
    r.add_argument("--devices", type=int, default=256)
    c = sub.add_parser("cpu")
    c.add_argument("--window", type=float, default=60.0)
    c.add_argument("--flamegraph", type=Path)
    p = sub.add_parser("probe-idle")
    p.add_argument("--gap", type=float, default=2.0)
    p.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    if args.what == "render":
        profile_render(args.devices)
    elif args.what == "cpu":
        profile_cpu(args.window, args.flamegraph)
    else:
        profile_probe_idle(args.gap, args.runs)


if __name__ == "__main__":
    main()
