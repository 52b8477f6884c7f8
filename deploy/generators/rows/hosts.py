"""The "Hosts and processes (multi-host)" row: memory, utilization and devices by host and by process index."""

from __future__ import annotations

from ..panels import DEV, MEM, Panel, Row, Target, bottom, top

ROW = Row(
    "Hosts and processes (multi-host)",
    [
        Panel(
            "Memory in use by host",
            "timeseries",
            "bytes",
            [Target(top(f"sum by (instance) (jaxmon_memory_bytes_in_use{{{MEM}}})"), "{{instance}}")],
            "One jaxmon per host: the sum over its devices (and workloads).",
            min=0,
        ),
        Panel(
            "Memory in use by JAX process index",
            "timeseries",
            "bytes",
            [
                Target(
                    "topk($k, sum by (process_index) ("
                    f"jaxmon_memory_bytes_in_use{{{MEM}}}"
                    " * on (job, instance, platform, device, workload) group_left (process_index) "
                    f"jaxmon_device_info{{{MEM}}}))",
                    "process {{process_index}}",
                )
            ],
            "Memory in use summed per jax.process_index() of a multi-host job.",
            min=0,
        ),
        Panel(
            "Utilization by host (estimate)",
            "timeseries",
            "percentunit",
            [Target(top(f"avg by (instance) (jaxmon_device_utilization_ratio{{{DEV}}})"), "{{instance}}")],
            "Average probe utilization estimate over each host's devices.",
            min=0,
            max=1,
        ),
        Panel(
            "Devices up by host",
            "timeseries",
            "none",
            [Target(bottom(f"sum by (instance) (jaxmon_device_up{{{DEV}}})"), "{{instance}}")],
            "Devices answering the probe on each host.",
            min=0,
        ),
        Panel(
            "Devices",
            "table",
            "none",
            [Target(f"count by (platform, device_kind, source, workload) (jaxmon_device_info{{{MEM}}})", table=True)],
            "Identity of each device: kind, JAX process index, TPU coordinates, source (local, replay, spool).",
            width=24,
        ),
    ],
)
