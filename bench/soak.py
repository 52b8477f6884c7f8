"""Soak: the daemon for 10 minutes at 20 scrapes/s with polls and probes going; RSS, threads and fds every 10 s.

    .venv/bin/python bench/soak.py                 # 600 s; writes bench/results/soak.csv and soak.json

The daemon runs on 8 JAX CPU devices with polls every 1 s and probes every 5 s per device (faster than the 5 s /
15 s defaults, so the snapshot and the rendered exposition change several times a second and any per-render or
per-probe leak shows sooner). One client scrapes /metrics 20 times a second on a schedule: gzip on every other
scrape, and a new TCP connection on every 10th (the rest reuse one keep-alive connection, as Prometheus does).
Every 10 s it records the daemon's VmRSS, thread count, open file descriptors and CPU seconds from /proc.
The summary gives start (first record), end, max, and RSS growth from the end of warm-up (60 s) to the end.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import sys
import threading
import time

from common import RESULTS, Jaxmon, cpu_seconds, median, open_fds, proc_status, running, save, wait_ready


class Scraper(threading.Thread):
    def __init__(self, port: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.period = 1.0 / rate
        self.stop_event = threading.Event()
        self.ok = 0
        self.failed = 0
        self.latencies: list[float] = []
        self.lock = threading.Lock()
        self.conn: http.client.HTTPConnection | None = None

    def _scrape(self, n: int) -> None:
        if self.conn is None or n % 10 == 0:
            if self.conn is not None:
                self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Accept-Encoding": "gzip"} if n % 2 else {}
        started = time.perf_counter()
        try:
            self.conn.request("GET", "/metrics", headers=headers)
            resp = self.conn.getresponse()
            body = resp.read()
            good = resp.status == 200 and len(body) > 0
        except (OSError, http.client.HTTPException):
            good = False
            self.conn.close()
            self.conn = None
        elapsed = time.perf_counter() - started
        with self.lock:
            if good:
                self.ok += 1
                self.latencies.append(elapsed)
            else:
                self.failed += 1

    def run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            self._scrape(n)
            n += 1
            next_at += self.period
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
            else:
                next_at = time.monotonic()  # fell behind: do not burst to catch up

    def window(self) -> tuple[int, int, list[float]]:
        with self.lock:
            ok, failed, lat = self.ok, self.failed, self.latencies
            self.ok, self.failed, self.latencies = 0, 0, []
        return ok, failed, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    ap.add_argument("--rate", type=float, default=20.0, help="scrapes per second (default 20)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between records (default 10)")
    ap.add_argument("--warmup", type=float, default=60.0, help="RSS growth is measured from here (default 60)")
    ap.add_argument("--poll-interval", default="1s")
    ap.add_argument("--probe-interval", default="5s")
    ap.add_argument("--name", default="soak", help="results name: bench/results/NAME.csv and NAME.json")
    args = ap.parse_args()

    daemon = Jaxmon(
        ["--poll.interval", args.poll_interval, "--collector.probe.interval", args.probe_interval], name=args.name
    )
    csv_path = RESULTS / f"{args.name}.csv"
    rows: list[dict[str, float]] = []
    with running(daemon):
        ready = wait_ready(daemon, daemon.url)
        print(f"daemon pid {daemon.pid} ready after {ready:.2f}s; soaking {args.duration:.0f}s at {args.rate}/s")
        scraper = Scraper(daemon.port, args.rate)
        t0 = time.monotonic()
        scraper.start()
        with open(csv_path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(
                [
                    "elapsed_s",
                    "rss_bytes",
                    "threads",
                    "open_fds",
                    "cpu_seconds",
                    "scrapes_ok",
                    "scrapes_failed",
                    "p99_ms",
                ]
            )
            next_at = t0
            while True:
                st = proc_status(daemon.pid)
                ok, failed, lat = scraper.window()
                lat.sort()
                p99 = lat[min(int(0.99 * len(lat)), len(lat) - 1)] * 1e3 if lat else 0.0
                row = {
                    "elapsed_s": round(time.monotonic() - t0, 1),
                    "rss_bytes": st["VmRSS"],
                    "threads": st["Threads"],
                    "open_fds": open_fds(daemon.pid),
                    "cpu_seconds": round(cpu_seconds(daemon.pid), 2),
                    "scrapes_ok": ok,
                    "scrapes_failed": failed,
                    "p99_ms": round(p99, 2),
                }
                rows.append(row)
                writer.writerow(row.values())
                fh.flush()
                print(
                    f"t={row['elapsed_s']:6.0f}s rss={row['rss_bytes'] / 2**20:7.1f} MiB threads={row['threads']}"
                    f" fds={row['open_fds']} scrapes ok={ok} failed={failed} p99={p99:.1f} ms",
                    flush=True,
                )
                if time.monotonic() - t0 >= args.duration:
                    break
                next_at += args.every
                time.sleep(max(next_at - time.monotonic(), 0.0))
        scraper.stop_event.set()
        scraper.join(5)
        alive = daemon.alive()

    def summary(key: str) -> dict[str, float]:
        values = [r[key] for r in rows]
        return {"start": values[0], "end": values[-1], "max": max(values), "min": min(values)}

    warm = [r for r in rows if r["elapsed_s"] >= args.warmup] or rows
    total_ok = sum(r["scrapes_ok"] for r in rows)
    total_failed = sum(r["scrapes_failed"] for r in rows)
    span = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    result = {
        "command": " ".join(["python bench/soak.py", *sys.argv[1:]]),
        "duration_s": span,
        "scrape_rate_per_s": args.rate,
        "poll_interval": args.poll_interval,
        "probe_interval": args.probe_interval,
        "rss_bytes": summary("rss_bytes"),
        "rss_growth_after_warmup_bytes": warm[-1]["rss_bytes"] - warm[0]["rss_bytes"],
        "threads": summary("threads"),
        "open_fds": summary("open_fds"),
        "scrapes_ok": total_ok,
        "scrapes_failed": total_failed,
        "achieved_scrapes_per_s": total_ok / span if span > 0 else 0.0,
        "median_window_p99_ms": median([r["p99_ms"] for r in rows if r["scrapes_ok"]] or [0.0]),
        "cpu_percent_of_a_core": 100 * (rows[-1]["cpu_seconds"] - rows[0]["cpu_seconds"]) / span if span else 0.0,
        "daemon_alive_at_end": alive,
        "csv": str(csv_path),
    }
    save(args.name, result)
    mib = 2**20
    print(
        f"RSS MiB start {result['rss_bytes']['start'] / mib:.1f} end {result['rss_bytes']['end'] / mib:.1f}"
        f" max {result['rss_bytes']['max'] / mib:.1f} (growth after warm-up"
        f" {result['rss_growth_after_warmup_bytes'] / mib:+.1f}); threads {result['threads']};"
        f" fds {result['open_fds']}; scrapes ok {total_ok} failed {total_failed}"
    )


if __name__ == "__main__":
    main()
