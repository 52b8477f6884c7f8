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
            "Embedded exporter stopping",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_exporter_stopping{{{INST}}}"), "{{instance}}")],
            "An embedded exporter (jaxmon.start()) says 1 in its last scrape when its job ends on purpose (stop() or a "
            "normal exit): a target down after it finished, not crashed (JaxmonExporterDown stays quiet).",
        ),
        Panel(
            "How embedded exporters' processes ended (1h)",
            "timeseries",
            "short",
            [
                Target(
                    f"count by (reason, signal) (last_over_time(jaxmon_exporter_exit_info{{{INST}}}[1h]))",
                    "{{reason}} {{signal}}",
                )
            ],
            "Embedded exporters that stopped in the last hour, by their last word: normal (stop(), the script's "
            "end), exception (an uncaught exception) or signal (SIGTERM, SIGINT). A process killed outright says "
            "nothing. Exception and signal, and a training target gone without a word, are JaxmonTrainingCrashed.",
            min=0,
        ),
        Panel(
            "API server lists",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_kubernetes_api_up{{{INST}}}"), "{{instance}} {{list}}")],
            "Whether a node-mode jaxmon's last list of its node's resourceslices and pods from the API server "
            "succeeded (the last good lists stay in use while it fails).",
            mappings=UP_MAPPING,
        ),
        Panel(
            "Seconds since API server list",
            "timeseries",
            "s",
            [
                Target(
                    top(f"time() - jaxmon_kubernetes_api_last_success_timestamp_seconds{{{INST}}}"),
                    "{{instance}} {{list}}",
                )
            ],
            "Age of the resourceslices and pods in use; it grows through an API-server outage.",
            min=0,
        ),
        Panel(
            "API server failures and DRA problems",
            "timeseries",
            "short",
            [
                Target(
                    top(f"increase(jaxmon_kubernetes_api_failures_total{{{INST}}}[$__rate_interval])"),
                    "{{instance}} {{list}} {{reason}}",
                ),
                Target(
                    top(f"increase(jaxmon_kubernetes_dra_problems_total{{{INST}}}[$__rate_interval])"),
                    "{{instance}} DRA {{reason}}",
                ),
                Target(
                    top(f"increase(jaxmon_kubernetes_process_problems_total{{{INST}}}[$__rate_interval])"),
                    "{{instance}} processes {{reason}}",
                ),
            ],
            "Failed lists by reason (forbidden: the ClusterRole is missing), DRA-claimed devices no "
            "ResourceSlice names (not_in_slices) or names without a uuid (no_identity), and GPU processes whose "
            "cgroup names a pod the API server does not list (pod_not_listed): they label nothing.",
            min=0,
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
