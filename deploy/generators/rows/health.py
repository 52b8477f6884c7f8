"""The "Exporter health" row: collectors, backends, scrape duration and versions of each jaxmon."""

from __future__ import annotations

from ..panels import INST, OK_MAPPING, UP_MAPPING, Panel, Row, Target, bottom, top

ROW = Row(
    "Exporter health",
    [
        Panel(
            "Collector success",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_collector_success{{{INST}}}"), "{{instance}} {{collector}}")],
            "Whether each collector's last run got all its data (memory, probe, spool).",
            mappings=OK_MAPPING,
        ),
        Panel(
            "Collector duration",
            "timeseries",
            "s",
            [Target(top(f"jaxmon_collector_duration_seconds{{{INST}}}"), "{{instance}} {{collector}}")],
            "Time of each collector's last run (probe: device time of the last round).",
            min=0,
        ),
        Panel(
            "Seconds since collector success",
            "timeseries",
            "s",
            [
                Target(
                    top(f"time() - jaxmon_collector_last_success_timestamp_seconds{{{INST}}}"),
                    "{{instance}} {{collector}}",
                )
            ],
            "Age of each collector's last successful run; it grows while a poll hangs.",
            min=0,
        ),
        Panel(
            "Backend up",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_backend_up{{{INST}}}"), "{{instance}} {{backend}}")],
            "JAX backends jaxmon tried to start; the log and the landing page say why one failed.",
            mappings=UP_MAPPING,
        ),
        Panel(
            "Scrape duration",
            "timeseries",
            "s",
            [Target(top(f"scrape_duration_seconds{{{INST}}}"), "{{instance}}")],
            "How long Prometheus takes to scrape each jaxmon (scrapes never touch a device).",
            min=0,
        ),
        Panel(
            "Versions",
            "table",
            "none",
            [
                Target(
                    f"count by (version, jax_version, jaxlib_version, python_version) (jaxmon_build_info{{{INST}}})",
                    table=True,
                )
            ],
            "jaxmon, jax, jaxlib and Python versions of each exporter.",
        ),
    ],
)
