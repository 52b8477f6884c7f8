"""/metrics throughput and p99 latency: jaxmon vs a plain prometheus_client exporter, same 8 devices, same wrk load.

    .venv/bin/python bench/scrape_throughput.py        # about 3 minutes; needs wrk (apt-get install wrk)

Both exporters run at once on 8 JAX CPU devices at their defaults (polls every 5 s, probes every 15 s):
`jaxmon serve` and bench/baseline_exporter.py (Gauges set from polling loops, served by start_http_server).
After both have calibrated their probes, wrk (1 thread, 10 connections, 10 s) loads one, then the other, in
alternating order (A B, B A, A B), once without and once with `Accept-Encoding: gzip` (what Prometheus sends).
Each figure is the median of the rounds; the CPU each server used per request (utime + stime over the run /
requests) is reported beside it. Target: jaxmon >= 3x the requests/s at <= 1/3 the p99.
"""

from __future__ import annotations

import argparse

from common import (
    Baseline,
    Jaxmon,
    all_calibrated,
    cpu_seconds,
    get,
    median,
    per_device,
    running,
    save,
    wait_for,
    wait_ready,
    wrk,
)

PROFILES = {"plain": (), "gzip": ("Accept-Encoding: gzip",)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--connections", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="wrk threads")
    args = ap.parse_args()

    jaxmon = Jaxmon(name="throughput-jaxmon")
    base = Baseline(name="throughput-baseline")
    targets = {"jaxmon": jaxmon, "baseline": base}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {p: {n: [] for n in targets} for p in PROFILES}
    with running(jaxmon, base):
        wait_ready(jaxmon, jaxmon.url)
        wait_ready(base, base.url, path="/metrics")
        wait_for(jaxmon.url, all_calibrated(), what="jaxmon probes calibrated")
        wait_for(base.url, lambda s: len(per_device(s, "jaxmon_probe_steps")) >= 8, what="baseline probes")
        sizes = {n: len(get(t.url)) for n, t in targets.items()}
        for t in targets.values():  # warm-up: connections, caches, first render
            wrk(t.url + "/metrics", 2, args.connections, args.threads)
        for profile, headers in PROFILES.items():
            for i in range(args.rounds):
                order = ["jaxmon", "baseline"] if i % 2 == 0 else ["baseline", "jaxmon"]
                for name in order:
                    cpu0 = cpu_seconds(targets[name].pid)
                    r = wrk(targets[name].url + "/metrics", args.duration, args.connections, args.threads, headers)
                    r["server_cpu_ms_per_request"] = 1e3 * (cpu_seconds(targets[name].pid) - cpu0) / r["requests"]
                    runs[profile][name].append(r)
                    print(
                        f"{profile:5} round {i} {name:8} {r['rps']:9.1f} req/s  p50 {r['p50'] * 1e3:7.2f} ms"
                        f"  p99 {r['p99'] * 1e3:7.2f} ms  errors {r['errors']:.0f} non-2xx {r['non_2xx']:.0f}"
                        f"  server CPU {r['server_cpu_ms_per_request']:.3f} ms/request",
                        flush=True,
                    )

    summary: dict[str, dict[str, float]] = {}
    for profile in PROFILES:
        j, b = runs[profile]["jaxmon"], runs[profile]["baseline"]
        s = {
            "jaxmon_rps": median([r["rps"] for r in j]),
            "baseline_rps": median([r["rps"] for r in b]),
            "jaxmon_p99_s": median([r["p99"] for r in j]),
            "baseline_p99_s": median([r["p99"] for r in b]),
            "jaxmon_cpu_ms_per_request": median([r["server_cpu_ms_per_request"] for r in j]),
            "baseline_cpu_ms_per_request": median([r["server_cpu_ms_per_request"] for r in b]),
            "jaxmon_errors": sum(r["errors"] + r["non_2xx"] for r in j),
            "baseline_errors": sum(r["errors"] + r["non_2xx"] for r in b),
        }
        s["throughput_ratio"] = s["jaxmon_rps"] / s["baseline_rps"]
        s["p99_ratio"] = s["jaxmon_p99_s"] / s["baseline_p99_s"]
        s["met"] = s["throughput_ratio"] >= 3 and s["p99_ratio"] <= 1 / 3
        summary[profile] = s
        print(
            f"{profile}: jaxmon {s['jaxmon_rps']:.0f} req/s p99 {s['jaxmon_p99_s'] * 1e3:.2f} ms; baseline "
            f"{s['baseline_rps']:.0f} req/s p99 {s['baseline_p99_s'] * 1e3:.2f} ms; "
            f"{s['throughput_ratio']:.1f}x throughput, p99 x{s['p99_ratio']:.2f} -> {'met' if s['met'] else 'MISSED'}"
        )
    save(
        "scrape_throughput",
        {
            "command": "python bench/scrape_throughput.py",
            "load": f"wrk -t{args.threads} -c{args.connections} -d{args.duration}s --latency, {args.rounds} rounds",
            "body_bytes": sizes,
            "summary": summary,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
