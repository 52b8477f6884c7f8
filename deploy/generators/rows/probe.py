"""The "Utilization and probe" row: the utilization estimate, probe latency against its baseline, cost, health."""

from __future__ import annotations

from ..panels import DEV, DEVICE_LEGEND, UP_MAPPING, Panel, Row, Target, bottom, rate, top

ROW = Row(
    "Utilization and probe",
    [
        Panel(
            "Utilization (estimate)",
            "timeseries",
            "percentunit",
            [Target(top(f"jaxmon_device_utilization_ratio{{{DEV}}}"))],
            "ESTIMATE from probe slowdown: 1 - baseline / latency. Absent while a device is down.",
            min=0,
            max=1,
        ),
        Panel(
            "Probe latency vs baseline",
            "timeseries",
            "s",
            [
                Target(top(f"jaxmon_probe_duration_seconds{{{DEV}}}"), DEVICE_LEGEND + " latency"),
                Target(top(f"jaxmon_probe_baseline_seconds{{{DEV}}}"), DEVICE_LEGEND + " baseline"),
            ],
            "Latency of the last probe run and the idle baseline; their ratio is the utilization estimate.",
            min=0,
        ),
        Panel(
            "Device up",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_device_up{{{DEV}}}"))],
            "1 when the device answered its last probe within the timeout.",
            mappings=UP_MAPPING,
        ),
        Panel(
            "Probe FLOP/s",
            "timeseries",
            "flops",
            [Target(bottom(f"jaxmon_probe_flops_per_second{{{DEV}}}"))],
            "FLOP/s of the last probe run (its share of the device).",
            min=0,
        ),
        Panel(
            "Probe runs, failures, timeouts and skips",
            "timeseries",
            "ops",
            [
                Target(top(rate("jaxmon_probe_runs_total", DEV)), DEVICE_LEGEND + " runs"),
                Target(top(rate("jaxmon_probe_failures_total", DEV)), DEVICE_LEGEND + " failures"),
                Target(top(rate("jaxmon_probe_timeouts_total", DEV)), DEVICE_LEGEND + " timeouts"),
                Target(top(rate("jaxmon_probe_skipped_total", DEV)), DEVICE_LEGEND + " skipped"),
                Target(top(rate("jaxmon_probe_deferred_total", DEV)), DEVICE_LEGEND + " deferred"),
            ],
            "Probe runs per second, and those that raised, timed out, or were skipped behind a hung run; deferred: "
            "runs left out while the job in the process trained on the device.",
            min=0,
        ),
        Panel(
            "Probe duty cycle",
            "timeseries",
            "percentunit",
            [Target(top(rate("jaxmon_probe_busy_seconds_total", DEV)))],
            "Share of each device's time spent running the probe (its cost).",
            min=0,
        ),
        Panel(
            "Probe memory footprint",
            "bargauge",
            "bytes",
            [Target(top(f"jaxmon_probe_memory_bytes{{{DEV}}}"))],
            "Device memory of the compiled probe, allocated once.",
            min=0,
        ),
        Panel(
            "Probe steps per run",
            "bargauge",
            "none",
            [Target(top(f"jaxmon_probe_steps{{{DEV}}}"))],
            "Matmul steps per run, chosen by the start-up calibration.",
            min=0,
        ),
        Panel(
            "Probe baseline origin",
            "table",
            "none",
            [
                Target(
                    f"count by (platform, origin) (jaxmon_probe_baseline_info{{{DEV}}})", DEVICE_LEGEND + " {{origin}}"
                )
            ],
            "Where each device's baseline comes from: calibrated (idle, now), restored "
            "(--collector.probe.baseline-file) or provisional (taken while a device-wide source said busy: no "
            "utilization estimate until idle).",
        ),
    ],
)
