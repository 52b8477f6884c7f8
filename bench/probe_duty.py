"""Probe device-time duty cycle at default settings.

    .venv/bin/python bench/probe_duty.py           # about 3 minutes

`jaxmon serve` on 8 JAX CPU devices at its defaults (probe every 15 s per device, calibrated to about 2 ms of
device time per run, n = 256). After calibration (a one-off at start, not counted), the rate of
jaxmon_probe_busy_seconds_total over a window of 150 s is each device's duty cycle; cross-checked against the
last probe duration / probe interval. Target: <= 0.1 % per device. On CPU the 8 "devices" share the machine's
cores, so the sum over devices (the share of the host CPU the probes take) is reported too.
"""

from __future__ import annotations

import argparse
import time

from common import Jaxmon, all_calibrated, median, per_device, running, save, scrape, wait_for, wait_ready

INTERVAL = 15.0  # the default --collector.probe.interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=150.0)
    args = ap.parse_args()

    daemon = Jaxmon(name="duty")
    with running(daemon):
        wait_ready(daemon, daemon.url)
        wait_for(daemon.url, all_calibrated(), what="probes calibrated")
        s0, t0 = scrape(daemon.url), time.monotonic()
        time.sleep(args.window)
        s1, t1 = scrape(daemon.url), time.monotonic()
    wall = t1 - t0
    b0, b1 = per_device(s0, "jaxmon_probe_busy_seconds_total"), per_device(s1, "jaxmon_probe_busy_seconds_total")
    r0, r1 = per_device(s0, "jaxmon_probe_runs_total"), per_device(s1, "jaxmon_probe_runs_total")
    durations = per_device(s1, "jaxmon_probe_duration_seconds")
    baselines = per_device(s1, "jaxmon_probe_baseline_seconds")
    steps = per_device(s1, "jaxmon_probe_steps")
    duty = {d: (b1[d] - b0[d]) / wall for d in b1}
    computed = {d: durations[d] / INTERVAL for d in durations}
    runs = {d: r1[d] - r0[d] for d in r1}
    for d in sorted(duty, key=int):
        print(
            f"device {d}: {runs[d]:.0f} runs in {wall:.0f} s, busy {100 * duty[d]:.4f} %,"
            f" last run {durations[d] * 1e3:.2f} ms (baseline {baselines[d] * 1e3:.2f} ms, {steps[d]:.0f} steps)"
            f" -> duration/interval {100 * computed[d]:.4f} %"
        )
    worst = max(duty.values())
    print(
        f"per device: median {100 * median(list(duty.values())):.4f} %, max {100 * worst:.4f} %;"
        f" all 8 together {100 * sum(duty.values()):.4f} % -> {'met' if worst <= 0.001 else 'MISSED'}"
    )
    save(
        "probe_duty",
        {
            "command": "python bench/probe_duty.py",
            "window_s": wall,
            "duty_percent_per_device": {d: 100 * v for d, v in duty.items()},
            "computed_percent_per_device": {d: 100 * v for d, v in computed.items()},
            "median_percent": 100 * median(list(duty.values())),
            "max_percent": 100 * worst,
            "sum_percent_all_devices": 100 * sum(duty.values()),
            "runs": runs,
            "last_duration_s": durations,
            "baseline_s": baselines,
            "utilization_at_end": per_device(s1, "jaxmon_device_utilization_ratio"),
            "met": worst <= 0.001,
        },
    )


if __name__ == "__main__":
    main()
