"""Daemon RSS vs a plain prometheus_client exporter that imports JAX.

    .venv/bin/python bench/daemon_rss.py           # about 3 minutes

Started side by side on 8 JAX CPU devices, each at its defaults: `jaxmon serve`, bench/baseline_exporter.py
(the same job: polls, a calibrated probe per device, start_http_server), bench/baseline_exporter.py --no-probe
(only imports JAX, polls memory_stats() and serves Gauges) and, to compare like with like, `jaxmon serve
--no-collector.probe`. After all are ready (probes calibrated),
10 scrapes each and a 30 s settle, VmRSS from /proc/PID/status. Two rounds; medians.
Target: jaxmon <= the baseline + 10 %.
"""

from __future__ import annotations

import argparse
import time

from common import (
    Baseline,
    Jaxmon,
    all_calibrated,
    get,
    median,
    per_device,
    proc_status,
    running,
    save,
    wait_for,
    wait_ready,
)

MiB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settle", type=float, default=30.0)
    args = ap.parse_args()

    rss: dict[str, list[int]] = {"jaxmon": [], "baseline": [], "jaxmon_no_probe": [], "baseline_no_probe": []}
    hwm: dict[str, list[int]] = {k: [] for k in rss}
    for i in range(args.rounds):
        children = {
            "jaxmon": Jaxmon(name=f"rss-jaxmon-{i}"),
            "baseline": Baseline(name=f"rss-baseline-{i}"),
            "jaxmon_no_probe": Jaxmon(["--no-collector.probe"], name=f"rss-jaxmon-np-{i}"),
            "baseline_no_probe": Baseline(["--no-probe"], name=f"rss-baseline-np-{i}"),
        }
        with running(*children.values()):
            for name in ("jaxmon", "jaxmon_no_probe"):
                wait_ready(children[name], children[name].url)
            for name in ("baseline", "baseline_no_probe"):
                wait_ready(children[name], children[name].url, path="/metrics")
            wait_for(children["jaxmon"].url, all_calibrated(), what="jaxmon probes")
            wait_for(
                children["baseline"].url,
                lambda s: len(per_device(s, "jaxmon_probe_steps")) >= 8,
                what="baseline probes",
            )
            for c in children.values():
                for _ in range(10):
                    get(c.url, headers={"Accept-Encoding": "gzip"})
            time.sleep(args.settle)
            for name, c in children.items():
                st = proc_status(c.pid)
                rss[name].append(st["VmRSS"])
                hwm[name].append(st["VmHWM"])
        print(", ".join(f"{k} {v[-1] / MiB:.1f} MiB" for k, v in rss.items()), flush=True)
    med = {k: median(v) for k, v in rss.items()}
    ratio = med["jaxmon"] / med["baseline"]
    ratio_np = med["jaxmon"] / med["baseline_no_probe"]
    ratio_both_np = med["jaxmon_no_probe"] / med["baseline_no_probe"]
    print(
        f"RSS: jaxmon {med['jaxmon'] / MiB:.1f} MiB, baseline (same job) {med['baseline'] / MiB:.1f} MiB"
        f" ({100 * (ratio - 1):+.1f} %), baseline without probe {med['baseline_no_probe'] / MiB:.1f} MiB"
        f" ({100 * (ratio_np - 1):+.1f} %); both without probe: jaxmon {med['jaxmon_no_probe'] / MiB:.1f} MiB"
        f" ({100 * (ratio_both_np - 1):+.1f} %) -> {'met' if ratio <= 1.10 else 'MISSED'}"
    )
    save(
        "daemon_rss",
        {
            "command": "python bench/daemon_rss.py",
            "rss_bytes": rss,
            "hwm_bytes": hwm,
            "median_rss_bytes": med,
            "ratio_vs_baseline": ratio,
            "ratio_vs_baseline_no_probe": ratio_np,
            "ratio_both_without_probe": ratio_both_np,
            "met": ratio <= 1.10,
            "met_vs_no_probe": ratio_np <= 1.10,
        },
    )


if __name__ == "__main__":
    main()
