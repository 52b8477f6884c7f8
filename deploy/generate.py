#!/usr/bin/env python3
"""Generate the deployment files that must agree with a single source.

- deploy/kubernetes/prometheusrule.yaml: the PrometheusRule, built from deploy/prometheus/alerts.yml (the same rules
  Prometheus loads in the compose stack), comments included;
- grafana/dashboards/jaxmon.json: the Grafana dashboard, built from the panel list below.

    python deploy/generate.py           # rewrite both
    python deploy/generate.py --check   # exit 1 if a committed file differs from what would be generated

Needs only the standard library and PyYAML. tests/test_deploy.py runs --check, so edit the sources and regenerate.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, deploy/ is sys.path[0], so the package beside this file imports by its own name.
from generators import rules
from generators.paths import ROOT

DASHBOARD = ROOT / "grafana" / "dashboards" / "jaxmon.json"

# --------------------------------------------------------------------------------------------------------------
# Grafana dashboard
# --------------------------------------------------------------------------------------------------------------

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Label selectors shared by the panels. `$workload` is left out of probe panels on purpose: a sidecar's probe
# series carry no workload label (the probe measures the device, not a process), so filtering them by workload
# would hide them; in embedded mode the workload label is there and "All" shows it.
INST = 'job=~"$job", instance=~"$instance"'
DEV = INST + ', platform=~"$platform", device=~"$device"'
MEM = DEV + ', workload=~"$workload"'
WL = INST + ', workload=~"$workload"'
DEVICES = '__name__=~"jaxmon_device_info|jaxmon_device_source_up"'

DEVICE_LEGEND = "{{instance}} {{platform}}:{{device}} {{workload}}"
# Device-wide series (NVML, libtpu) carry the source that read them.
WIDE_LEGEND = "{{instance}} {{platform}}:{{device}} ({{source}})"


@dataclass
class Target:
    """One query of a panel."""

    expr: str
    legend: str = DEVICE_LEGEND
    table: bool = False  # an instant query rendered as a table (identity metrics)


@dataclass
class Panel:
    """One dashboard panel: its kind, unit and queries."""

    title: str
    kind: str  # timeseries, stat, state-timeline, table, bargauge
    unit: str
    targets: list[Target]
    description: str = ""
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: list[tuple[float, str]] = field(default_factory=list)
    mappings: dict[str, tuple[str, str]] = field(default_factory=dict)  # value -> (text, colour)


@dataclass
class Row:
    """A titled group of panels."""

    title: str
    panels: list[Panel]


UP_MAPPING = {"1": ("up", "green"), "0": ("down", "red")}
YES_NO_MAPPING = {"1": ("yes", "green"), "0": ("no", "red")}
OK_MAPPING = {"1": ("ok", "green"), "0": ("failing", "red")}


def _rate(metric: str, selector: str) -> str:
    return f"rate({metric}{{{selector}}}[$__rate_interval])"


ROWS = [
    Row(
        "Overview",
        [
            Panel(
                "Exporters up",
                "stat",
                "none",
                [Target(f"sum(up{{{INST}}})", "up")],
                "jaxmon targets Prometheus scrapes successfully.",
                width=4,
                height=4,
            ),
            Panel(
                "Devices answering the probe",
                "stat",
                "none",
                [Target(f"sum(jaxmon_device_up{{{DEV}}})", "up")],
                "Devices whose last probe finished within --probe.timeout.",
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
    ),
    Row(
        "Memory",
        [
            Panel(
                "Memory in use vs limit",
                "timeseries",
                "bytes",
                [
                    Target(f"jaxmon_memory_bytes_in_use{{{MEM}}}", DEVICE_LEGEND + " in use"),
                    Target(f"jaxmon_memory_limit_bytes{{{MEM}}}", DEVICE_LEGEND + " limit"),
                    Target(f"jaxmon_memory_pool_bytes{{{MEM}}}", DEVICE_LEGEND + " pool"),
                ],
                "Bytes allocated, the allocator's limit (total x memory fraction) and, with the BFC allocator, the "
                "pool actually obtained from the driver.",
                min=0,
            ),
            Panel(
                "Memory in use / limit",
                "timeseries",
                "percentunit",
                [Target(f"jaxmon_memory_bytes_in_use{{{MEM}}} / (jaxmon_memory_limit_bytes{{{MEM}}} > 0)")],
                "Share of the limit in use; JaxmonMemoryNearLimit fires above 95 % for 15 minutes.",
                min=0,
                max=1,
                thresholds=[(0, "green"), (0.95, "red")],
            ),
            Panel(
                "Peak memory in use",
                "timeseries",
                "bytes",
                [Target(f"jaxmon_memory_peak_bytes_in_use{{{MEM}}}")],
                "The allocator's high-water mark since it started (never resets).",
                min=0,
            ),
            Panel(
                "Free memory",
                "timeseries",
                "bytes",
                [Target(f"jaxmon_memory_free_bytes{{{MEM}}}")],
                "bytes_limit - bytes_in_use.",
                min=0,
            ),
            Panel(
                "Fragmentation",
                "timeseries",
                "percentunit",
                [Target(f"jaxmon_memory_fragmentation_ratio{{{MEM}}}")],
                "1 - largest free block / free memory in the pool; absent where the allocator does not track free "
                "blocks (cuda_async). JaxmonMemoryFragmented fires above 0.5 with under 20 % free.",
                min=0,
                max=1,
                thresholds=[(0, "green"), (0.5, "orange"), (0.8, "red")],
            ),
            Panel(
                "Largest allocatable (OOM headroom)",
                "timeseries",
                "bytes",
                [Target(f"jaxmon_memory_largest_allocatable_bytes{{{MEM}}}")],
                "Estimated largest single allocation that can still succeed.",
                min=0,
            ),
            Panel(
                "Largest free block",
                "timeseries",
                "bytes",
                [Target(f"jaxmon_memory_largest_free_block_bytes{{{MEM}}}")],
                "Largest contiguous free block in the obtained pool.",
                min=0,
            ),
            Panel(
                "Largest allocation so far",
                "timeseries",
                "bytes",
                [Target(f"jaxmon_memory_largest_alloc_bytes{{{MEM}}}")],
                "Largest single allocation the allocator has served; compare with the headroom.",
                min=0,
            ),
            Panel(
                "Allocations per second",
                "timeseries",
                "ops",
                [Target(_rate("jaxmon_memory_allocations_total", MEM))],
                "Rate of allocator allocations (num_allocs).",
                min=0,
            ),
            Panel(
                "Live array bytes (devices without allocator stats)",
                "timeseries",
                "bytes",
                [Target(f"jaxmon_memory_live_array_bytes{{{MEM}}}")],
                "Bytes of live jax.Array shards in a workload process, where memory_stats() reports nothing (CPU).",
                min=0,
            ),
            Panel(
                "memory_stats() supported",
                "state-timeline",
                "none",
                [Target(f"jaxmon_memory_stats_supported{{{MEM}}}")],
                "Whether the device's allocator reports statistics at all (not on CPU).",
                mappings=YES_NO_MAPPING,
            ),
            Panel(
                "memory_stats() read success",
                "state-timeline",
                "none",
                [Target(f"jaxmon_memory_read_success{{{MEM}}}")],
                "Whether the last memory_stats() call returned (0: it raised).",
                mappings=OK_MAPPING,
            ),
            Panel(
                "memory_stats() errors",
                "timeseries",
                "short",
                [Target(f"increase(jaxmon_memory_read_errors_total{{{MEM}}}[$__rate_interval])")],
                "memory_stats() calls that raised, per interval.",
                min=0,
            ),
        ],
    ),
    Row(
        "Utilization and probe",
        [
            Panel(
                "Utilization (estimate)",
                "timeseries",
                "percentunit",
                [Target(f"jaxmon_device_utilization_ratio{{{DEV}}}")],
                "ESTIMATE from probe slowdown: 1 - baseline / latency. Absent while a device is down.",
                min=0,
                max=1,
            ),
            Panel(
                "Probe latency vs baseline",
                "timeseries",
                "s",
                [
                    Target(f"jaxmon_probe_duration_seconds{{{DEV}}}", DEVICE_LEGEND + " latency"),
                    Target(f"jaxmon_probe_baseline_seconds{{{DEV}}}", DEVICE_LEGEND + " baseline"),
                ],
                "Latency of the last probe run and the idle baseline; their ratio is the utilization estimate.",
                min=0,
            ),
            Panel(
                "Device up",
                "state-timeline",
                "none",
                [Target(f"jaxmon_device_up{{{DEV}}}")],
                "1 when the device answered its last probe within the timeout.",
                mappings=UP_MAPPING,
            ),
            Panel(
                "Probe FLOP/s",
                "timeseries",
                "flops",
                [Target(f"jaxmon_probe_flops_per_second{{{DEV}}}")],
                "FLOP/s of the last probe run (its share of the device).",
                min=0,
            ),
            Panel(
                "Probe runs, failures, timeouts and skips",
                "timeseries",
                "ops",
                [
                    Target(_rate("jaxmon_probe_runs_total", DEV), DEVICE_LEGEND + " runs"),
                    Target(_rate("jaxmon_probe_failures_total", DEV), DEVICE_LEGEND + " failures"),
                    Target(_rate("jaxmon_probe_timeouts_total", DEV), DEVICE_LEGEND + " timeouts"),
                    Target(_rate("jaxmon_probe_skipped_total", DEV), DEVICE_LEGEND + " skipped"),
                ],
                "Probe runs per second, and those that raised, timed out, or were skipped behind a hung run.",
                min=0,
            ),
            Panel(
                "Probe duty cycle",
                "timeseries",
                "percentunit",
                [Target(_rate("jaxmon_probe_busy_seconds_total", DEV))],
                "Share of each device's time spent running the probe (its cost).",
                min=0,
            ),
            Panel(
                "Probe memory footprint",
                "bargauge",
                "bytes",
                [Target(f"jaxmon_probe_memory_bytes{{{DEV}}}")],
                "Device memory of the compiled probe, allocated once.",
                min=0,
            ),
            Panel(
                "Probe steps per run",
                "bargauge",
                "none",
                [Target(f"jaxmon_probe_steps{{{DEV}}}")],
                "Matmul steps per run, chosen by the start-up calibration.",
                min=0,
            ),
            Panel(
                "Probe baseline origin",
                "table",
                "none",
                [Target(f"jaxmon_probe_baseline_info{{{DEV}}}", DEVICE_LEGEND + " {{origin}}")],
                "Where each device's baseline comes from: calibrated (idle, now), restored (--probe.baseline-file) or "
                "provisional (taken while a device-wide source said busy: no utilization estimate until idle).",
            ),
        ],
    ),
    # Device-wide numbers from a source outside JAX (NVML on GPU, libtpu's runtime metrics on TPU): the shared family
    # names with a `source` label, so one row serves both. A sidecar beside a job that holds the chips sees these
    # without owning a device.
    Row(
        "Device-wide (NVML on GPU, libtpu on TPU)",
        [
            Panel(
                "Duty cycle (device-wide) vs probe estimate",
                "timeseries",
                "percentunit",
                [
                    Target(f"jaxmon_device_duty_cycle_ratio{{{DEV}}}", WIDE_LEGEND + " duty cycle"),
                    Target(f"jaxmon_device_utilization_ratio{{{DEV}}}", DEVICE_LEGEND + " probe estimate"),
                ],
                "Share of the last sample period with any kernel running, as the device-wide source reports it (one "
                "tiny kernel running all the time reads 100 %), beside the probe's slowdown estimate of the same "
                "device where both exist.",
                min=0,
                max=1,
            ),
            Panel(
                "Device memory used vs total (all processes)",
                "timeseries",
                "bytes",
                [
                    Target(f"jaxmon_device_memory_used_bytes{{{DEV}}}", WIDE_LEGEND + " used"),
                    Target(f"jaxmon_device_memory_total_bytes{{{DEV}}}", WIDE_LEGEND + " total"),
                ],
                "Device-wide memory: every process on the device plus what jaxmon's allocator statistics cannot see.",
                min=0,
            ),
            Panel(
                "Device memory used / total (all processes)",
                "timeseries",
                "percentunit",
                [
                    Target(
                        f"jaxmon_device_memory_used_bytes{{{DEV}}} / jaxmon_device_memory_total_bytes{{{DEV}}}",
                        WIDE_LEGEND,
                    )
                ],
                "Share of device memory in use by all processes; JaxmonDeviceMemoryNearFull fires over 95 %.",
                min=0,
                max=1,
                thresholds=[(0, "green"), (0.95, "red")],
            ),
            Panel(
                "Device memory by process",
                "timeseries",
                "bytes",
                [
                    Target(
                        f"jaxmon_process_device_memory_bytes{{{MEM}}}",
                        "{{instance}} {{platform}}:{{device}} pid {{pid}} {{workload}}",
                    )
                ],
                "Each running compute process's device memory (NVML); workload where the pid is a reporting "
                "workload's (needs a shared PID namespace).",
                min=0,
            ),
            Panel(
                "Memory bandwidth utilization",
                "timeseries",
                "percentunit",
                [Target(f"jaxmon_device_memory_bandwidth_utilization_ratio{{{DEV}}}", WIDE_LEGEND)],
                "Share of the last sample period in which device memory was read or written.",
                min=0,
                max=1,
            ),
            Panel(
                "Power vs limit",
                "timeseries",
                "watt",
                [
                    Target(f"jaxmon_device_power_watts{{{DEV}}}", WIDE_LEGEND + " power"),
                    Target(f"jaxmon_device_power_limit_watts{{{DEV}}}", WIDE_LEGEND + " limit"),
                ],
                "Power draw and the enforced power limit.",
                min=0,
            ),
            Panel(
                "Temperature",
                "timeseries",
                "celsius",
                [Target(f"jaxmon_device_temperature_celsius{{{DEV}}}", WIDE_LEGEND)],
                "GPU core temperature; JaxmonGpuHot fires over 85 °C.",
                thresholds=[(0, "green"), (85, "red")],
            ),
            Panel(
                "SM clock",
                "timeseries",
                "hertz",
                [Target(f"jaxmon_device_sm_clock_hertz{{{DEV}}}", WIDE_LEGEND)],
                "Current SM clock; it drops while a throttle reason is active.",
                min=0,
            ),
            Panel(
                "Active throttle reasons",
                "state-timeline",
                "none",
                [
                    Target(
                        f'jaxmon_device_throttled{{{DEV}, reason!="gpu_idle"}} == 1',
                        "{{instance}} {{platform}}:{{device}} {{reason}}",
                    )
                ],
                "Clocks event (throttle) reasons NVML reports as active, idle clocks left out.",
            ),
            Panel(
                "HLO queue size (TPU)",
                "timeseries",
                "none",
                [Target(f"jaxmon_device_hlo_queue_size{{{DEV}}}", WIDE_LEGEND)],
                "Programs queued for execution on each TPU device (libtpu). Near 0 on an idle chip means the host "
                "does not feed it.",
                min=0,
            ),
            Panel(
                "HLO execution time (TPU)",
                "timeseries",
                "s",
                [
                    Target(
                        f"jaxmon_device_hlo_execution_seconds{{{DEV}}}",
                        WIDE_LEGEND + " p{{percentile}}",
                    ),
                    Target(f"jaxmon_device_hlo_execution_mean_seconds{{{DEV}}}", WIDE_LEGEND + " mean"),
                ],
                "Percentiles and mean of HLO program execution time on each TPU device, from libtpu's distribution.",
                min=0,
            ),
            Panel(
                "Device-wide source up",
                "state-timeline",
                "none",
                [Target(f"jaxmon_device_source_up{{{DEV}}}", WIDE_LEGEND)],
                "Whether the device-wide source answered for the device in its last poll (0: e.g. GPU lost).",
                mappings=UP_MAPPING,
            ),
            Panel(
                "ECC errors (volatile)",
                "timeseries",
                "none",
                [Target(f"jaxmon_device_ecc_errors_total{{{DEV}}}", WIDE_LEGEND + " {{kind}}")],
                "ECC errors counted since the driver loaded, by kind; absent where ECC is off.",
                min=0,
            ),
            Panel(
                "Xid errors",
                "timeseries",
                "none",
                [Target(f"jaxmon_device_xid_errors_total{{{DEV}}}", WIDE_LEGEND + " xid {{xid}}")],
                "Critical Xid events counted since jaxmon started, by xid (79: fallen off the bus, 48: DBE).",
                min=0,
            ),
        ],
    ),
    Row(
        "Workloads and compilation",
        [
            Panel(
                "Compilations per minute",
                "timeseries",
                "cpm",
                [
                    Target(
                        f"{_rate('jaxmon_jit_compilations_total', WL)} * 60", "{{workload}} process {{process_index}}"
                    )
                ],
                "XLA backend compilations; steady compiling after warm-up is a recompilation storm.",
                min=0,
            ),
            Panel(
                "Share of time compiling",
                "timeseries",
                "percentunit",
                [Target(_rate("jaxmon_jit_compile_seconds_total", WL), "{{workload}} process {{process_index}}")],
                "Seconds of backend compilation per second of wall time.",
                min=0,
            ),
            Panel(
                "Compilation cache hits and misses",
                "timeseries",
                "ops",
                [
                    Target(
                        _rate("jaxmon_compilation_cache_hits_total", WL), "{{workload}} process {{process_index}} hits"
                    ),
                    Target(
                        _rate("jaxmon_compilation_cache_misses_total", WL),
                        "{{workload}} process {{process_index}} misses",
                    ),
                ],
                "Persistent compilation cache hits and misses (entries written) per second.",
                min=0,
            ),
            Panel(
                "Seconds since last report",
                "timeseries",
                "s",
                [
                    Target(
                        f"time() - jaxmon_workload_last_report_timestamp_seconds{{{WL}}}",
                        "{{workload}} process {{process_index}}",
                    )
                ],
                "Age of each workload process's latest spool snapshot; it disappears after --spool.ttl.",
                min=0,
            ),
            Panel(
                "Workload processes",
                "table",
                "none",
                [Target(f"jaxmon_workload_info{{{WL}}}", table=True)],
                "Each workload process reporting to a spool: host, pid, JAX process index and version.",
                width=24,
                height=6,
            ),
            Panel(
                "Spool files rejected",
                "timeseries",
                "short",
                [Target(f"increase(jaxmon_spool_rejected_files_total{{{INST}}}[$__rate_interval])", "{{reason}}")],
                "Spool files skipped because they are not what a publisher writes, by reason.",
                min=0,
                width=8,
                height=6,
            ),
            Panel(
                "Spool files left unread",
                "timeseries",
                "short",
                [Target(f"increase(jaxmon_spool_overflow_files_total{{{INST}}}[$__rate_interval])", "{{reason}}")],
                "Live spool files left out of polls: past --spool.max-workloads, or past --spool.max-reads-per-poll "
                "(read later). Anything above 0 means workloads are missing from this dashboard.",
                min=0,
                width=8,
                height=6,
            ),
            Panel(
                "Stale spool files",
                "timeseries",
                "short",
                [
                    Target(f"jaxmon_spool_stale_files{{{INST}}}", "stale, still there"),
                    Target(
                        f"increase(jaxmon_spool_removed_files_total{{{INST}}}[$__rate_interval])", "removed {{kind}}"
                    ),
                ],
                "Files of crashed or stopped publishers past --spool.ttl still in the directory (a read-only mount "
                "keeps them), and those the sidecar removed.",
                min=0,
                width=8,
                height=6,
            ),
        ],
    ),
    Row(
        "Hosts and processes (multi-host)",
        [
            Panel(
                "Memory in use by host",
                "timeseries",
                "bytes",
                [Target(f"sum by (instance) (jaxmon_memory_bytes_in_use{{{MEM}}})", "{{instance}}")],
                "One jaxmon per host: the sum over its devices (and workloads).",
                min=0,
            ),
            Panel(
                "Memory in use by JAX process index",
                "timeseries",
                "bytes",
                [
                    Target(
                        "sum by (process_index) ("
                        f"jaxmon_memory_bytes_in_use{{{MEM}}}"
                        " * on (job, instance, platform, device, workload) group_left (process_index) "
                        f"jaxmon_device_info{{{MEM}}})",
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
                [Target(f"avg by (instance) (jaxmon_device_utilization_ratio{{{DEV}}})", "{{instance}}")],
                "Average probe utilization estimate over each host's devices.",
                min=0,
                max=1,
            ),
            Panel(
                "Devices up by host",
                "timeseries",
                "none",
                [Target(f"sum by (instance) (jaxmon_device_up{{{DEV}}})", "{{instance}}")],
                "Devices answering the probe on each host.",
                min=0,
            ),
            Panel(
                "Devices",
                "table",
                "none",
                [Target(f"jaxmon_device_info{{{MEM}}}", table=True)],
                "Identity of each device: kind, JAX process index, TPU coordinates, source (local, replay, spool).",
                width=24,
            ),
        ],
    ),
    Row(
        "Exporter health",
        [
            Panel(
                "Collector success",
                "state-timeline",
                "none",
                [Target(f"jaxmon_collector_success{{{INST}}}", "{{instance}} {{collector}}")],
                "Whether each collector's last run got all its data (memory, probe, spool).",
                mappings=OK_MAPPING,
            ),
            Panel(
                "Collector duration",
                "timeseries",
                "s",
                [Target(f"jaxmon_collector_duration_seconds{{{INST}}}", "{{instance}} {{collector}}")],
                "Time of each collector's last run (probe: device time of the last round).",
                min=0,
            ),
            Panel(
                "Seconds since collector success",
                "timeseries",
                "s",
                [
                    Target(
                        f"time() - jaxmon_collector_last_success_timestamp_seconds{{{INST}}}",
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
                [Target(f"jaxmon_backend_up{{{INST}}}", "{{instance}} {{backend}}")],
                "JAX backends jaxmon tried to start; the log and the landing page say why one failed.",
                mappings=UP_MAPPING,
            ),
            Panel(
                "Scrape duration",
                "timeseries",
                "s",
                [Target(f"scrape_duration_seconds{{{INST}}}", "{{instance}}")],
                "How long Prometheus takes to scrape each jaxmon (scrapes never touch a device).",
                min=0,
            ),
            Panel(
                "Versions",
                "table",
                "none",
                [Target(f"jaxmon_build_info{{{INST}}}", table=True)],
                "jaxmon, jax, jaxlib and Python versions of each exporter.",
            ),
        ],
    ),
]


def _variable(name: str, label: str, query: str, all_value: str | None = None) -> dict[str, Any]:
    variable: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }
    if all_value is not None:
        # Without it, "All" is the alternation of the listed values (Grafana's default).
        variable["allValue"] = all_value
    return variable


def templating() -> list[dict[str, Any]]:
    """The dashboard's variables: data source, then job, instance, platform, device and workload, chained."""
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "regex": "",
            "hide": 0,
        },
        _variable("job", "Job", "label_values(jaxmon_build_info, job)"),
        # From `up`, so that an exporter that is down still shows (and counts) as a host.
        _variable("instance", "Host (instance)", 'label_values(up{job=~"$job"}, instance)'),
        # Devices JAX sees (jaxmon_device_info) and devices only a device-wide source sees (a TPU held by the
        # trainer, read through libtpu; a GPU through NVML): jaxmon_device_source_up.
        _variable("platform", "Platform", f"label_values({{{DEVICES}, {INST}}}, platform)"),
        _variable(
            "device",
            "Device",
            f'label_values({{{DEVICES}, {INST}, platform=~"$platform"}}, device)',
        ),
        # All = ".*", which also matches series without the label: a sidecar's own devices have no workload.
        _variable("workload", "Workload", f"label_values(jaxmon_device_info{{{INST}}}, workload)", all_value=".*"),
    ]


def _panel_json(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    steps = p.thresholds or [(0, "green")]
    defaults["thresholds"] = {
        "mode": "absolute",
        "steps": [{"color": colour, "value": None if i == 0 else value} for i, (value, colour) in enumerate(steps)],
    }
    if p.mappings:
        defaults["mappings"] = [
            {
                "type": "value",
                "options": {
                    value: {"text": text, "color": colour, "index": i}
                    for i, (value, (text, colour)) in enumerate(p.mappings.items())
                },
            }
        ]
    if p.kind in ("timeseries",):
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never"}
    targets = []
    for i, t in enumerate(p.targets):
        target: dict[str, Any] = {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": t.expr,
            "legendFormat": "__auto" if t.table else t.legend,
        }
        if t.table:
            target.update({"format": "table", "instant": True, "range": False})
        elif p.kind in ("stat", "bargauge"):
            target.update({"instant": True, "range": False})
        else:
            target.update({"instant": False, "range": True})
        targets.append(target)
    panel: dict[str, Any] = {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": targets,
    }
    if p.kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True, "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif p.kind == "stat":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
        }
    elif p.kind == "bargauge":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "displayMode": "basic",
            "orientation": "horizontal",
        }
    elif p.kind == "state-timeline":
        panel["options"] = {"mergeValues": True, "showValue": "auto", "legend": {"showLegend": False}}
    elif p.kind == "table":
        panel["options"] = {"showHeader": True}
        panel["transformations"] = [
            {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}}}
        ]
    return panel


def dashboard() -> dict[str, Any]:
    """The whole dashboard, laid out left to right, top to bottom, a row header before each group."""
    panels: list[dict[str, Any]] = []
    panel_id = 1
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x = 0
        line_height = 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(p, panel_id, x, y))
            panel_id += 1
            x += p.width
            line_height = max(line_height, p.height)
        y += line_height
    return {
        "uid": "jaxmon",
        "title": "jaxmon: JAX accelerators",
        "description": "Memory, fragmentation, OOM headroom, utilization estimate, device health and compilation "
        "of JAX accelerators, from jaxmon (a Prometheus exporter).",
        "tags": ["jaxmon", "jax", "accelerators"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": templating()},
        "panels": panels,
    }


def dashboard_text() -> str:
    """The dashboard as committed: two-space indent, trailing newline."""
    return json.dumps(dashboard(), indent=2) + "\n"


# --------------------------------------------------------------------------------------------------------------


def outputs() -> dict[Path, str]:
    """Every generated file and its expected content."""
    return {**rules.outputs(), DASHBOARD: dashboard_text()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if a committed file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    for path in stale:
        print(f"{path.relative_to(ROOT)} is out of date: run python deploy/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
