"""The "Overview" row: exporters up, devices up and down, workloads reporting, the worst memory figures."""

from __future__ import annotations

from ..panels import DEV, MEM, WL, Panel, Row, Target, exporters_up

ROW = Row(
    "Overview",
    [
        exporters_up(width=4),
        Panel(
            "Devices answering the probe",
            "stat",
            "none",
            [Target(f"sum(jaxmon_device_up{{{DEV}}})", "up")],
            "Devices whose last probe finished within --collector.probe.timeout.",
            width=4,
            height=4,
        ),
        Panel(
            "Devices down",
            "stat",
            "none",
            [Target(f"count(jaxmon_device_up{{{DEV}}} == 0) or vector(0)", "down")],
            "Devices whose probe failed or timed out (see the JaxmonDeviceDown alert).",
            width=4,
            height=4,
            thresholds=[(0, "green"), (1, "red")],
        ),
        Panel(
            "Workload processes reporting",
            "stat",
            "none",
            [Target(f"count(jaxmon_workload_info{{{WL}}}) or vector(0)", "processes")],
            "Workload processes publishing to a jaxmon spool (publisher + sidecar mode).",
            width=4,
            height=4,
        ),
        Panel(
            "Worst fragmentation",
            "stat",
            "percentunit",
            [Target(f"max(jaxmon_memory_fragmentation_ratio{{{MEM}}})", "fragmentation")],
            "Highest allocator fragmentation over the selected devices.",
            width=4,
            height=4,
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.5, "orange"), (0.8, "red")],
        ),
        Panel(
            "Smallest OOM headroom",
            "stat",
            "bytes",
            [Target(f"min(jaxmon_memory_largest_allocatable_bytes{{{MEM}}})", "headroom")],
            "Smallest 'largest allocation that can still succeed' over the selected devices.",
            width=4,
            height=4,
        ),
    ],
)
