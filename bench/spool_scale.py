"""A spool directory with thousands of workload files: scrape size and time, scan time, /healthz, sidecar RSS.

    .venv/bin/python bench/spool_scale.py                       # about 3 minutes
    .venv/bin/python bench/spool_scale.py --tree /path/to/old   # the same against another checkout (before/after)

For each count (2 000 and 20 000 by default) a fresh directory gets that many valid publisher files, each of 8
devices with GPU-like memory_stats (what one trainer process on an 8-GPU host writes). `jaxmon serve --no-
collector.probe --collector.spool.dir DIR --collector.spool.ttl 10m` at its other defaults (--collector.spool.max-
workloads 128, --collector.spool.max-reads-per-poll 256, poll every 5 s) reads it; after 4 polls: /metrics size,
median of 10 scrapes (plain text), the spool collector's duration, /healthz, VmRSS. Then every file is deleted and
VmRSS read again after 3 polls. Targets (issue 13): a scrape under 1 s and RSS bounded whatever lands in the
directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from common import Jaxmon, get, median, proc_status, running, save, scrape, status, wait_ready

MiB = 2**20
STATS = {
    "num_allocs": 42,
    "bytes_in_use": 1610612736,
    "peak_bytes_in_use": 1879048192,
    "largest_alloc_size": 536870912,
    "bytes_reserved": 0,
    "peak_bytes_reserved": 0,
    "largest_free_block_bytes": 268435456,
    "bytes_limit": 64424509440,
    "pool_bytes": 2147483648,
    "peak_pool_bytes": 2147483648,
}


def document(i: int) -> dict[str, object]:
    now = time.time()
    devices = [
        {"id": d, "platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "memory_stats": STATS} for d in range(8)
    ]
    return {
        "schema": "jaxmon.spool/1",
        "workload": f"w{i:05d}",
        "host": "bench-host",
        "pid": 1000 + i,
        "process_index": 0,
        "jax_version": "0.10.2",
        "time": now,
        "started": now,
        "interval": 5.0,
        "devices": devices,
        "compile": {"compilations": 3, "compile_seconds": 0.5, "cache_hits": 1, "cache_misses": 2},
    }


def one(count: int, tree: Path | None, polls: int) -> dict[str, object]:
    spool = Path(tempfile.mkdtemp(prefix="jaxmon-spool-bench-"))
    try:
        for i in range(count):
            (spool / f"w{i:05d}.bench-host.{1000 + i}.json").write_text(json.dumps(document(i)))
        d = Jaxmon(
            ["--no-collector.probe", "--collector.spool.dir", str(spool), "--collector.spool.ttl", "10m"],
            name=f"spool-scale-{count}",
            tree=tree,
        )
        with running(d):
            wait_ready(d, d.url, timeout=300)
            time.sleep(5.0 * polls)
            times, size = [], 0
            for _ in range(10):
                started = time.perf_counter()
                body = get(d.url, timeout=120)
                times.append(time.perf_counter() - started)
                size = len(body)
            s = scrape(d.url)
            workloads = sum(1 for k in s if k[0] == "jaxmon_workload_info")
            duration = s.get(("jaxmon_collector_duration_seconds", frozenset({("collector", "spool")})))
            healthz = status(d.url, "/healthz")
            rss = proc_status(d.pid)["VmRSS"]
            for p in spool.iterdir():
                p.unlink()
            time.sleep(5.0 * 3)
            rss_after = proc_status(d.pid)["VmRSS"]
            return {
                "files": count,
                "workloads_exported": workloads,
                "metrics_bytes": size,
                "scrape_median_seconds": median(times),
                "scrape_max_seconds": max(times),
                "spool_collector_seconds": duration,
                "healthz": healthz,
                "rss_mib": rss / MiB,
                "rss_after_delete_mib": rss_after / MiB,
            }
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--polls", type=int, default=4)
    ap.add_argument("--tree", type=Path, help="run another checkout's jaxmon (e.g. the code before the change)")
    ap.add_argument("--name", default="spool_scale")
    args = ap.parse_args()
    rounds = [one(n, args.tree, args.polls) for n in args.counts]
    save(args.name, {"tree": str(args.tree) if args.tree else "this checkout", "rounds": rounds})


if __name__ == "__main__":
    main()
