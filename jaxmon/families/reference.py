"""The metrics reference, docs/metrics.md, generated from the families' `Spec`s and this table.

    python -m jaxmon.families.reference            # write docs/metrics.md
    python -m jaxmon.families.reference --check    # exit 1 when docs/metrics.md differs (tests/unit hold it too)

Each family's name, type and HELP come from the `Spec` it is rendered with; its labels and where its number comes
from (`LABELS_AND_SOURCE`, in jaxmon/families/labels.py) and which collectors render it (`SECTIONS`) are here, once;
its unit is the one its name ends in. A family some collector renders with no `Spec` of the family tables
(jaxmon/collectors/*.py declare a few inline) has its `Spec` in `INLINE`, with the collector's HELP:
tests/unit/test_metrics_reference.py holds every family's HELP and type to what the collectors render, and every
rendered family to an entry here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jaxmon.families import Spec, libtpu, memory, nvml, nvml_process, shared, slurm, training
from jaxmon.families import compile as compile_families
from jaxmon.families import kubernetes as kubernetes_families
from jaxmon.families.labels import LABELS_AND_SOURCE
from jaxmon.lastword import STOPPING, STOPPING_HELP

PATH = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


@dataclass(frozen=True)
class Entry:
    """One family of the reference."""

    spec: Spec
    kind: str  # gauge, counter, histogram or summary

    @property
    def exposed(self) -> str:
        """The name its samples carry (`_total` for a counter; a histogram's and a summary's suffixes aside)."""
        return self.spec.name + ("_total" if self.kind == "counter" else "")


def _entries(specs: Sequence[Spec]) -> list[Entry]:
    return [Entry(s, "counter" if s.counter else "gauge") for s in specs]


# Families the collectors render without a Spec of the family tables: the same name, HELP and type.
INLINE = {
    "exposition": _entries(
        [
            Spec("jaxmon_build_info", "jaxmon, jax, jaxlib and Python versions; always 1."),
            Spec("jaxmon_backend_up", "1 when the JAX backend initialised, 0 when it failed (the log says why)."),
            Spec(
                "jaxmon_collector_success",
                "1 when the collector's last run got all its data (memory: every device read; probe: every device "
                "answered).",
            ),
            Spec(
                "jaxmon_collector_duration_seconds",
                "Time of the collector's last run (probe: device time of the last round).",
            ),
            Spec(
                "jaxmon_collector_last_success_timestamp_seconds", "Unix time of the collector's last successful run."
            ),
            Spec(STOPPING, STOPPING_HELP),
        ]
    ),
    "probe": _entries(
        [
            Spec(
                "jaxmon_probe_baseline_info",
                "Where the probe's baseline comes from, always 1: calibrated (now, device idle), restored "
                "(--collector.probe.baseline-file), provisional (taken while a device-wide source said the device was "
                "busy; no utilization estimate until an idle recalibration).",
            )
        ]
    ),
    "spool": _entries(
        [
            Spec(
                "jaxmon_workload_last_report_timestamp_seconds",
                "Unix time the workload process last wrote its spool file (the file's mtime on the sidecar's clock).",
            ),
            Spec(
                "jaxmon_spool_rejected_files",
                "Spool files skipped because they are not what a publisher writes.",
                True,
            ),
            Spec(
                "jaxmon_spool_overflow_files",
                "Live spool files left unread in a poll: past --collector.spool.max-workloads, or past "
                "--collector.spool.max-reads-per-poll (read at a later poll); counted every poll they are left out.",
                True,
            ),
            Spec(
                "jaxmon_spool_removed_files",
                "Stale publisher files (json) and crashed writers' temporary files (tmp) the sidecar removed.",
                True,
            ),
            Spec(
                "jaxmon_spool_stale_files",
                "Files in the spool directory past --collector.spool.ttl and not (yet) removed, orphaned temporary "
                "files included.",
            ),
        ]
    ),
    "nvml": _entries(
        [
            Spec(
                "jaxmon_device_xid_errors",
                "Critical Xid events NVML delivered since jaxmon started, by xid (see the runbook for 48 and 79).",
                True,
            ),
            Spec(
                "jaxmon_process_device_memory_bytes",
                "Device memory used by each running compute process (NVML; pid in NVML's PID namespace), the "
                "--collector.nvml.max-processes largest per GPU. workload is set where a workload report has that pid, "
                "which needs a shared PID namespace.",
            ),
            Spec(
                "jaxmon_process_device_memory_other_bytes",
                "Device memory used by the compute processes of the GPU beyond the --collector.nvml.max-processes "
                "largest (NVML; 0 when every process has its own series).",
            ),
            Spec(
                "jaxmon_process_device_memory_other_processes",
                "Compute processes of the GPU beyond the --collector.nvml.max-processes largest, whose memory is "
                "jaxmon_process_device_memory_other_bytes (NVML).",
            ),
        ]
    ),
    "kubernetes": _entries(
        [
            Spec(
                "jaxmon_kubernetes_pod_device_info",
                "1 for each GPU, MIG device or TPU chip the kubelet assigned to a container (device_id as the device "
                "plugin names it; for a DRA claim's device, resource is the driver, device_id pool/device, and claim "
                "the claim); absent while the kubelet does not answer, after the ttl.",
            )
        ]
    ),
}


def _probe() -> list[Entry]:
    from jaxmon.families.probe import PROBE_METRICS  # its table of (name, HELP, reader): no JAX imported

    return [Entry(Spec(m.name, m.help, m.counter), "counter" if m.counter else "gauge") for m in PROBE_METRICS]


def _training() -> list[Entry]:
    specs = [training.STEPS, training.STEP, training.DISPATCHED, training.LAST_STEP, training.LOSS, training.LOSS_STEP]
    rest = [training.EXAMPLES, training.TOKENS, training.MODEL_FLOPS, training.HARDWARE_FLOPS]
    rest += [training.HARDWARE_BYTES, training.PEAK, training.MFU, training.HFU, training.HOST_WAIT]
    rest += [training.START_TIME, training.PRODUCTIVE, training.BADPUT, training.PROBLEMS]
    rest += [training.COLLECTIVE_BYTES, training.PROGRAM_PEAK_MEMORY, training.LINK_BANDWIDTH]
    rest += [training.PROFILES, training.PROFILED, training.PROFILE_PARTS, training.PROFILE_COLLECTIVES]
    rest += [training.PROFILE_EXPOSED, training.PROFILE_COLLECTIVE_BYTES]
    rest += [training.PROFILE_COPY_SECONDS, training.PROFILE_COPY_BYTES]
    rest += [training.SAMPLE_STEP, training.COLLECTIVE_WAIT]
    return [*_entries(specs), Entry(training.DURATION, "histogram"), *_entries(rest)]


@dataclass(frozen=True)
class Section:
    """The families one collector (or the exposition itself) renders, and where it runs."""

    collector: str
    where: str
    entries: list[Entry]


DEVICE_WIDE = [
    shared.DEVICE_SOURCE_UP,
    shared.DEVICE_MEMORY_TOTAL,
    shared.DEVICE_MEMORY_USED,
    shared.DEVICE_DUTY_CYCLE,
    shared.DEVICE_MEMORY_BANDWIDTH,
]


def sections() -> list[Section]:
    """Every family, by the collector that renders it first, in exposition order; a family several collectors render
    is listed once, with each of them (`collectors`)."""
    nvml_specs = [spec for spec, _ in nvml.GPU_VALUES if spec not in DEVICE_WIDE]
    nvml_specs += [nvml.THROTTLED, nvml.ECC, nvml.FAN, nvml.PCIE_THROUGHPUT, nvml.REMAPPED_ROWS]
    nvml_specs += [nvml.REMAPPING_PENDING, nvml.REMAPPING_FAILED, nvml.NVLINK_ACTIVE, nvml.NVLINK_BYTES]
    nvml_specs += [nvml.NVLINK_ERRORS, nvml.MIG_ENABLED, nvml.MIG_INFO, nvml.MIG_MEMORY_TOTAL, nvml.MIG_MEMORY_USED]
    nvml_specs += [nvml.MIG_DUTY_CYCLE, nvml.GPM_SUPPORTED]
    nvml_specs += list(dict.fromkeys(spec for spec, _ in nvml.GPM_SERIES.values()))
    process_specs = [spec for spec, _ in nvml_process.PROCESS_UTILIZATION]
    memory_specs = [memory.STATS_SUPPORTED, memory.READ_SUCCESS, memory.READ_ERRORS, memory.LIVE_ARRAY_BYTES]
    memory_specs += [memory.REPLICATED_ARRAY_BYTES, memory.HOST_ARRAY_BYTES]
    tpu_specs = [libtpu.IDLE_DURATION, libtpu.HLO_QUEUE, libtpu.HLO_EXECUTION, libtpu.HLO_EXECUTION_MEAN]
    sdk_specs = [libtpu.TENSORCORE_UTILIZATION, libtpu.SDK_STATUS, libtpu.SDK_STARTS]
    return [
        Section(
            "exposition",
            "every jaxmon (each scrape)",
            [*INLINE["exposition"], *_entries([shared.DEVICE_INFO, shared.WORKLOAD_INFO])],
        ),
        Section(
            "memory",
            "embedded and sidecar (this process's JAX devices; off in node mode)",
            [*_entries([m.spec for m in memory.MEMORY_METRICS]), *_entries(memory_specs)],
        ),
        Section(
            "probe",
            "embedded and sidecar (this process's JAX devices; off in node mode)",
            [*_probe(), *INLINE["probe"]],
        ),
        Section(
            "compile",
            "embedded: the workload process (workload only)",
            [Entry(spec, "counter") for spec, _ in compile_families.COMPILE_METRICS],
        ),
        Section("training", "embedded: the workload process, once it calls jaxmon.step() (workload only)", _training()),
        Section("spool", "sidecar with --collector.spool.dir (the publishers' workloads)", INLINE["spool"]),
        Section(
            "nvml",
            "every mode where NVML loads (node mode included)",
            [*_entries(DEVICE_WIDE), *_entries(nvml_specs), *INLINE["nvml"], *_entries(process_specs)],
        ),
        Section(
            "tpu",
            "every mode where libtpu's runtime metrics service answers (node mode included)",
            [*_entries(tpu_specs), *[Entry(spec, "summary") for spec in libtpu.MEGASCALE.values()]],
        ),
        Section(
            "tpu (libtpu's monitoring SDK)",
            "the daemon (sidecar or node mode) with the tpu collector, read in a child process; never embedded",
            _entries(sdk_specs),
        ),
        Section(
            "kubernetes",
            "where the kubelet's pod-resources socket is (node mode); the API server's families where the node's "
            "name is known",
            [*INLINE["kubernetes"], *_entries(kubernetes_families.SPECS)],
        ),
        Section(
            "slurm",
            "where the cgroup tree shows Slurm's, with NVML (node mode on a Slurm node)",
            _entries([slurm.JOB_DEVICE_INFO]),
        ),
    ]


# Who else renders a family listed in an earlier section.
ALSO = {
    **{m.spec.name: ("spool",) for m in memory.MEMORY_METRICS},
    **{s.name: ("spool",) for s in (memory.STATS_SUPPORTED, memory.READ_SUCCESS, memory.READ_ERRORS)},
    memory.LIVE_ARRAY_BYTES.name: ("spool",),
    memory.REPLICATED_ARRAY_BYTES.name: ("spool",),
    memory.HOST_ARRAY_BYTES.name: ("spool",),
    **{spec.name: ("spool",) for spec, _ in compile_families.COMPILE_METRICS},
    shared.DEVICE_INFO.name: ("spool", "nvml"),
    shared.WORKLOAD_INFO.name: ("spool",),
    **{s.name: ("tpu",) for s in DEVICE_WIDE},
}


def _training_also() -> dict[str, tuple[str, ...]]:
    return {e.spec.name: ("spool",) for e in _training()}


# A family's unit: the one its name ends in (Prometheus naming), the longest first.
UNITS = (
    ("_flops_per_second", "FLOP/s"),
    ("_bytes_per_second", "bytes/s"),
    ("_timestamp_seconds", "Unix seconds"),
    ("_time_seconds", "Unix seconds"),
    ("_seconds", "seconds"),
    ("_bytes", "bytes"),
    ("_ratio", "ratio (0-1)"),
    ("_watts", "watts"),
    ("_joules", "joules"),
    ("_celsius", "°C"),
    ("_hertz", "hertz"),
    ("_flops", "FLOPs"),
    ("_info", "1 (info)"),
)


def unit(name: str) -> str:
    """The unit of family `name` (without `_total`), or a dash where it is a count or a state."""
    return next((shown for suffix, shown in UNITS if name.endswith(suffix)), "—")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(section: Section, also: dict[str, tuple[str, ...]]) -> Iterator[str]:
    yield "| metric | type | unit | labels | meaning (HELP) | source | also rendered by |"
    yield "|---|---|---|---|---|---|---|"
    for entry in section.entries:
        name = entry.spec.name
        if name not in LABELS_AND_SOURCE:
            raise KeyError(f"{name}: no labels and source in jaxmon/families/labels.py LABELS_AND_SOURCE")
        labels, source = LABELS_AND_SOURCE[name]
        others = ", ".join(also.get(name, ())) or "—"
        cells = [f"`{entry.exposed}`", entry.kind, unit(name), labels, entry.spec.help, source, others]
        yield "| " + " | ".join(_cell(c) for c in cells) + " |"


HEADER = """# Metrics reference

<!-- Generated by `python -m jaxmon.families.reference` from jaxmon/families/ (the Specs) and
jaxmon/families/reference.py (labels, sources, collectors). Do not edit: change those and regenerate;
tests/unit/test_metrics_reference.py fails while this file differs. -->

Every family jaxmon serves, by the collector that renders it (`--collector.NAME`; `/metrics?collect[]=NAME` selects
it), with the HELP it is served with. A counter's samples end in `_total`; a histogram's row stands for its
`_bucket`, `_sum` and `_count`, a summary's for its quantiles, `_sum` and `_count`.

All per-device series carry `device` (the JAX device id; on device-wide series, which also carry `source`, the
source's own id where it cannot be matched to a JAX device for certain: always libtpu's `device-id`) and `platform`
(`gpu`, `tpu`, `cpu`, …), and `workload` when they come from a workload process (embedded, or a spooled publisher).
`(+ pod, namespace, container)` are the owner labels: where the `kubernetes` collector runs, every series of a device
a pod holds carries its `namespace`, `pod` and `container`, whatever collector made it: the device-wide series
(`source="nvml"`, `source="libtpu"`), and those of this process's own JAX devices where the `nvml` collector matched
the device to a GPU (`device_match` other than `nvml_index` on the GPU's `jaxmon_device_info{source="nvml"}`);
never a spooled workload's devices, whose ids are their process's. One step adds them to every collector's series
(the owner transform, DESIGN.md §13). A number a source does not report is an **absent series**, never 0
and never NaN. NVML's series of one NVLink add `link`; those of a MIG device carry its GPU's `device` with
`mig_uuid`, `gpu_instance`, `compute_instance` and `profile`.

Where jaxmon runs decides what it sees: **embedded** (`jaxmon.start()` in the training script), **publisher +
sidecar** (`jaxmon.publish()`, and `jaxmon serve --collector.spool.dir`), **sidecar alone** (`jaxmon serve`) and
**node** (`jaxmon serve --node`, a DaemonSet: no JAX, so no memory or probe collector).

**Counters are born at zero**, so that `rate()` and `increase()` see every second of them (Prometheus cannot see a
series' first value). From `start()` or `publish()` on, before the first step, a workload process exports at 0: the
steps, examples and tokens, host wait and productive seconds, the step histogram, each built-in badput kind (startup,
compile, checkpoint, restore, host, restart, stall) and the kinds declared in `collector.training.badput_kinds`, every
tracking problem's reason, every sampled-trace result and each device's sampled parts (where sampling is on), and the
compile counters. A series that cannot exist before its first event is exported at 0 for at least one scrape before it
counts: a badput kind not declared (from its first open: its seconds count once it closed and a scrape served the 0),
the model and hardware FLOPs and accessed bytes of a device (from the first step that gives them), collective bytes of a
program's (op, axes) (once jaxmon's thread has analysed it), a sampled collective op (from the sample that first saw
it). Every new counter series is held at 0 until a scrape has served it, then counts whole: an embedded exporter's and a
spooled process's alike (the spool's daemon holds them, per process: a restarted process's series start at 0, a counter
reset Prometheus sees, even where it compiled the same programs as the process before it). A scrape is any `/metrics`
render (`collect[]` too): where `jaxmon top` or a second Prometheus reads the same exporter, the first one's scrape
frees the series, and so does a scrape Prometheus gave up on (its scrape_timeout). To join the processes of one workload
across restarts, use `jaxmon_training_start_time_seconds`: each process's own, its value changes at each restart
(`changes(jaxmon_training_start_time_seconds[1h])` counts them). In the OpenMetrics exposition (a scraper that sends
`Accept: application/openmetrics-text`, as Prometheus does) every training counter and the step histogram carry
`_created`, as client_python writes it: the process's `jaxmon_training_start_time_seconds`, from which each of them
counts (a series born later read 0 until then); jaxmon's other counters carry none (they count from the exporter's
`process_start_time_seconds`). The text format has no `_created`. A Prometheus that does not ingest created timestamps
(2.42, as Debian packages it, does not; newer ones do behind a feature flag) stores each as a series of its own
(`jaxmon_training_steps_created`), as it does client_python's; a `metric_relabel_configs` rule dropping
`__name__=~"jaxmon_training_.*_created"` keeps them out.

**Goodput and throughput** are recorded by deploy/prometheus/job.yml ([job rules](job-rules.md)) once per workload:
`jaxmon:training_goodput_ratio:rate5m` (productive / (productive + every badput kind), summed over the job's
processes), `jaxmon:training_badput_ratio:rate5m` (each kind's share), `jaxmon:training_tokens_per_second:rate1m` and
`jaxmon:training_examples_per_second:rate1m`. Over a whole run, goodput is
`sum(increase(jaxmon_training_productive_seconds_total{workload="W"}[RUN])) /
(sum(increase(jaxmon_training_productive_seconds_total{workload="W"}[RUN])) +
sum(increase(jaxmon_training_badput_seconds_total{workload="W"}[RUN])))`.
"""


def render() -> str:
    """docs/metrics.md as the code says it."""
    also = {**ALSO, **_training_also()}
    out = [HEADER]
    for section in sections():
        title = "Every scrape" if section.collector == "exposition" else f"`{section.collector}` collector"
        out.append(f"## {title}\n\nRuns: {section.where}.\n")
        out.extend(_rows(section, also))
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/metrics.md, or with --check say whether it is what `render()` makes (exit 1 when not)."""
    ap = argparse.ArgumentParser(prog="python -m jaxmon.families.reference", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the file differs; write nothing")
    ap.add_argument("--output", type=Path, default=PATH, help=f"default: {PATH}")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python -m jaxmon.families.reference", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
