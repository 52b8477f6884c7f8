"""Daemon CPU at default settings on 8 devices: no scrapes, and one scrape per second.

    .venv/bin/python bench/daemon_cpu.py           # about 5 minutes (2 rounds x 2 windows of 60 s)

`jaxmon serve` on 8 JAX CPU devices at its defaults (polls every 5 s, probes every 15 s per device, staggered).
After start-up and probe calibration (not counted) and a 15 s settle, windows of 60 s alternate: no scrapes,
then one gzip scrape per second on a keep-alive connection (as Prometheus does), twice over. CPU is utime + stime
of the daemon (all threads) from /proc/PID/stat over each window, as % of one core; the figure is the median of
each condition's windows. The probe's own device time (rate of jaxmon_probe_busy_seconds_total, summed over the
8 devices) is reported beside it: on CPU devices the probe's device time is the daemon's own CPU time.
In the same windows a second daemon runs with `--no-collector.probe`: what the daemon costs besides the probe's
device work (on a GPU or TPU that work runs on the device, not on the host CPU). `--compare-tree DIR` adds a
daemon from another checkout's jaxmon/ at defaults in the same windows (before/after a change).
Target: <= 0.2 % of a core in both conditions.
"""

from __future__ import annotations

import argparse
import http.client
import threading
import time
from pathlib import Path

from common import (
    Jaxmon,
    all_calibrated,
    cpu_seconds,
    median,
    per_device,
    running,
    save,
    sched_seconds,
    scrape,
    wait_for,
    wait_ready,
)


def busy_total(url: str) -> float:
    return sum(per_device(scrape(url), "jaxmon_probe_busy_seconds_total").values())


def window(daemons: dict[str, Jaxmon], seconds: float, scrapes_per_s: float) -> dict[str, dict[str, float]]:
    """One window over every daemon at once (each scraped at the same rate)."""
    stop = threading.Event()
    counts = dict.fromkeys(daemons, 0)

    def scraper(name: str, daemon: Jaxmon) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        next_at = time.monotonic()
        while not stop.is_set():
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            conn.getresponse().read()
            counts[name] += 1
            next_at += 1.0 / scrapes_per_s
            stop.wait(max(next_at - time.monotonic(), 0.0))
        conn.close()

    busy0 = {n: busy_total(d.url) for n, d in daemons.items()}  # read outside the window
    time.sleep(1.0)
    cpu0 = {n: (cpu_seconds(d.pid), sched_seconds(d.pid)) for n, d in daemons.items()}
    t0 = time.monotonic()
    threads = [threading.Thread(target=scraper, args=item, daemon=True) for item in daemons.items()]
    if scrapes_per_s > 0:
        for t in threads:
            t.start()
    time.sleep(seconds)
    cpu1 = {n: (cpu_seconds(d.pid), sched_seconds(d.pid)) for n, d in daemons.items()}
    wall = time.monotonic() - t0
    stop.set()
    if scrapes_per_s > 0:
        for t in threads:
            t.join(5)
    time.sleep(1.0)
    out = {}
    for n, d in daemons.items():
        busy1 = busy_total(d.url)
        out[n] = {
            "wall_s": wall,
            "cpu_s": cpu1[n][0] - cpu0[n][0],
            "cpu_percent": 100 * (cpu1[n][0] - cpu0[n][0]) / wall,
            "schedstat_cpu_percent": 100 * (cpu1[n][1] - cpu0[n][1]) / wall,
            "probe_busy_percent": 100 * (busy1 - busy0[n]) / (wall + 2.0),
            "scrapes": counts[n],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=60.0, help="seconds per window (>= 60 for the figure)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument(
        "--compare-tree",
        type=Path,
        help="also run the jaxmon package of this directory (e.g. `git archive HEAD jaxmon | tar -x -C DIR`) in the "
        "same windows, for before/after",
    )
    args = ap.parse_args()

    daemons = {"jaxmon": Jaxmon(name="cpu"), "no_probe": Jaxmon(["--no-collector.probe"], name="cpu-no-probe")}
    if args.compare_tree is not None:
        daemons["compare"] = Jaxmon(name="cpu-compare", tree=args.compare_tree.resolve())
    conditions = {"no_scrapes": 0.0, "one_scrape_per_s": 1.0}
    windows: dict[str, dict[str, list[dict[str, float]]]] = {n: {c: [] for c in conditions} for n in daemons}
    with running(*daemons.values()):
        for name, d in daemons.items():
            wait_ready(d, d.url)
            if name != "no_probe":
                wait_for(d.url, all_calibrated(), what="probes calibrated")
        time.sleep(args.settle)
        for i in range(args.rounds):
            for cond, rate in conditions.items():
                result = window(daemons, args.window, rate)
                for name, w in result.items():
                    windows[name][cond].append(w)
                    print(
                        f"round {i} {name:8} {cond:17} cpu {w['cpu_s']:.2f} s over {w['wall_s']:.1f} s ="
                        f" {w['cpu_percent']:.3f} % of a core (schedstat {w['schedstat_cpu_percent']:.3f} %;"
                        f" probe device time {w['probe_busy_percent']:.3f} %, {w['scrapes']} scrapes)",
                        flush=True,
                    )
    summary = {
        name: {
            cond: {
                "cpu_percent": median([w["cpu_percent"] for w in ws]),
                "schedstat_cpu_percent": median([w["schedstat_cpu_percent"] for w in ws]),
                "probe_busy_percent": median([w["probe_busy_percent"] for w in ws]),
                "met": median([w["cpu_percent"] for w in ws]) <= 0.2,
            }
            for cond, ws in per_cond.items()
        }
        for name, per_cond in windows.items()
    }
    for name, per_cond in summary.items():
        for cond, s in per_cond.items():
            print(
                f"{name} {cond}: {s['cpu_percent']:.3f} % of a core (schedstat {s['schedstat_cpu_percent']:.3f} %,"
                f" probe {s['probe_busy_percent']:.3f} %) -> {'met' if s['met'] else 'MISSED'}"
            )
    save(
        "daemon_cpu",
        {
            "command": "python bench/daemon_cpu.py"
            + (f" --compare-tree {args.compare_tree}" if args.compare_tree else ""),
            "summary": summary,
            "windows": windows,
        },
    )


if __name__ == "__main__":
    main()
