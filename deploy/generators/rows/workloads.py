"""The "Workloads and compilation" row: compilations, the compilation cache and the workloads' spool."""

from __future__ import annotations

from ..panels import INST, WL, Panel, Row, Target, increase, rate, top

ROW = Row(
    "Workloads and compilation",
    [
        Panel(
            "Compilations per minute",
            "timeseries",
            "cpm",
            [
                Target(
                    top(f"{rate('jaxmon_jit_compilations_total', WL)} * 60"), "{{workload}} process {{process_index}}"
                )
            ],
            "XLA backend compilations; steady compiling after warm-up is a recompilation storm.",
            min=0,
        ),
        Panel(
            "Share of time compiling",
            "timeseries",
            "percentunit",
            [Target(top(rate("jaxmon_jit_compile_seconds_total", WL)), "{{workload}} process {{process_index}}")],
            "Seconds of backend compilation per second of wall time.",
            min=0,
        ),
        Panel(
            "Compilation cache hits and misses",
            "timeseries",
            "ops",
            [
                Target(
                    top(rate("jaxmon_compilation_cache_hits_total", WL)), "{{workload}} process {{process_index}} hits"
                ),
                Target(
                    top(rate("jaxmon_compilation_cache_misses_total", WL)),
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
                    top(f"time() - jaxmon_workload_last_report_timestamp_seconds{{{WL}}}"),
                    "{{workload}} process {{process_index}}",
                )
            ],
            "Age of each workload process's latest spool snapshot; it disappears after --collector.spool.ttl.",
            min=0,
        ),
        Panel(
            "Workload processes",
            "table",
            "none",
            [Target(f"count by (workload, jax_version) (jaxmon_workload_info{{{WL}}})", table=True)],
            "Each workload process reporting to a spool: host, pid, JAX process index and version.",
            width=24,
            height=6,
        ),
        Panel(
            "Spool files rejected",
            "timeseries",
            "short",
            [
                Target(
                    f"sum by (reason) ({increase('jaxmon_spool_rejected_files_total', INST)})",
                    "{{reason}}",
                )
            ],
            "Spool files skipped because they are not what a publisher writes, by reason.",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Spool files left unread",
            "timeseries",
            "short",
            [
                Target(
                    f"sum by (reason) ({increase('jaxmon_spool_overflow_files_total', INST)})",
                    "{{reason}}",
                )
            ],
            "Live spool files left out of polls: past --collector.spool.max-workloads, or past "
            "--collector.spool.max-reads-per-poll (read later). Anything above 0 means workloads are missing from "
            "this dashboard.",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Stale spool files",
            "timeseries",
            "short",
            [
                Target(f"sum(jaxmon_spool_stale_files{{{INST}}})", "stale, still there"),
                Target(
                    f"sum by (kind) ({increase('jaxmon_spool_removed_files_total', INST)})",
                    "removed {{kind}}",
                ),
            ],
            "Files of crashed or stopped publishers past --collector.spool.ttl still in the directory (a read-only "
            "mount keeps them), and those the sidecar removed.",
            min=0,
            width=8,
            height=6,
        ),
    ],
)
