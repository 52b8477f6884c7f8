"""The spool collector: what every workload process published (`jaxmon.publish`), labelled by workload.

The reader (`jaxmon.sources.spool`) validates each file and, inside the same per-file guard, calls
`workload_report` (jaxmon.sources.spool_codec, the document's reader) to turn it into the same memory and compile
numbers an embedded exporter has; a file that fails either step is one rejected file, never a failed poll. This adds
each workload process's identity and what the reader had to reject, leave unread or remove.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import structlog
from prometheus_client.core import Metric
from pydantic import Field, field_validator

from jaxmon.births import Births, with_zeros
from jaxmon.catalog import metrics
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Offers, Update
from jaxmon.device_readings import DeviceInfo
from jaxmon.exchange import WORKLOAD_PIDS
from jaxmon.families import add
from jaxmon.families.checkpoint import checkpoint_families
from jaxmon.families.compile import compile_families
from jaxmon.families.memory import MemoryRow, memory_families
from jaxmon.families.training import training_families, training_labels
from jaxmon.logsetup import ErrorLog
from jaxmon.settings import CollectorOptions, Duration, Enabled
from jaxmon.snapshot import Snapshot
from jaxmon.sources.spool import SpoolReader
from jaxmon.sources.spool_codec import WorkloadReport, workload_report

log = structlog.get_logger("jaxmon.collectors.spool")


@dataclass(frozen=True)
class SpoolState:
    """The latest report of every live workload process, and what the reader rejected, skipped and removed."""

    workloads: tuple[WorkloadReport, ...] = ()
    rejected: Mapping[str, int] = field(default_factory=dict)
    overflow: Mapping[str, int] = field(default_factory=dict)
    removed: Mapping[str, int] = field(default_factory=dict)
    stale: int | None = None  # None: the directory could not be listed


class SpoolOptions(CollectorOptions):
    """`--collector.spool.*` (formerly `--spool.*`): the shared directory workload processes publish to."""

    enabled: Enabled = Field(default="auto", description="true, false, or auto (on when --collector.spool.dir is set).")
    dir: Path | None = Field(default=None, description="Aggregate workload snapshots published to this directory.")
    ttl: Duration = Field(
        default=30.0, description="A workload whose file was not rewritten for longer than this disappears."
    )
    max_file_bytes: int = Field(default=1 << 20, ge=1024, description="Larger spool files are rejected.")
    max_workloads: int = Field(
        default=128,
        ge=1,
        le=100_000,
        description="At most this many workload processes (live files, in name order) are exported; the rest are "
        "counted in jaxmon_spool_overflow_files_total.",
    )
    max_reads_per_poll: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="At most this many new or changed spool files are read per poll; the rest wait for the next.",
    )
    remove_after: Duration | None = Field(
        default=None,
        description="Publisher files and crashed writers' temporary files older than this are removed where the "
        "sidecar may write (default 10 x ttl).",
    )

    @field_validator("dir")
    @classmethod
    def _check_dir(cls, value: Path | None) -> Path | None:
        # A missing directory may still appear (the trainer creates it); something else in its place never works.
        if value is not None and value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a directory")
        return value


def workload_pids(state: SpoolState) -> Mapping[int, str]:
    """Workload names by pid, from the reports (what NVML's process list is joined on)."""
    return {report.pid: report.workload for report in state.workloads}


@register
class SpoolCollector(Collector[SpoolOptions, SpoolState]):
    """Workload snapshots from the spool directory."""

    name = "spool"
    description = "Workload processes' snapshots published to --collector.spool.dir (jaxmon.publish)."
    options = SpoolOptions
    offers: ClassVar[Offers] = {WORKLOAD_PIDS: workload_pids}
    order = 40
    # The spool is other processes' files: a slow or huge directory must not make this process's own liveness
    # fail (/healthz restarts the sidecar, which fixes nothing). jaxmon_collector_success says how it goes.
    heartbeat = False

    @classmethod
    def unavailable(cls, opts: SpoolOptions, ctx: Context) -> str | None:
        """Needs a spool directory."""
        return None if opts.dir is not None else "no --collector.spool.dir given"

    def __init__(self, opts: SpoolOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        assert opts.dir is not None  # unavailable() otherwise
        self.reader: SpoolReader[WorkloadReport] = SpoolReader(
            opts.dir,
            opts.ttl,
            workload_report,
            max_file_bytes=opts.max_file_bytes,
            max_workloads=opts.max_workloads,
            reads_per_poll=opts.max_reads_per_poll,
            remove_after=opts.remove_after,
        )
        self._errors = ErrorLog(log)
        self._last = SpoolState(
            rejected=dict(self.reader.rejected), overflow=dict(self.reader.overflow), removed=dict(self.reader.removed)
        )
        self._seen: set[tuple[str, int, str, int]] = set()  # (workload, process_index, host, pid) last scan
        self._births = Births()
        self._unheld: tuple[SpoolState | None, SpoolState | None] = (None, None)  # the last state, and unheld

    def update(self) -> Update[SpoolState]:
        """Scan the directory; when it cannot be listed, keep serving the last good workloads and say so."""
        directory = str(self.reader.directory)
        self._births.begin()
        try:
            scan = self.reader.scan()
        except OSError as exc:
            self._errors.error(
                "spool", "spool directory unreadable", str(exc), same=type(exc).__name__, directory=directory
            )
            self._last = replace(self._last, rejected=dict(self.reader.rejected), stale=None)
            return Update(self._last, success=False)
        self._errors.ok("spool", "spool directory readable again", directory=directory)
        # Last report time: the file's mtime on this clock, the same time liveness is judged by.
        reports = [replace(f.value, time=f.mtime) for f in scan.live]
        workloads = tuple(self._held(w) for w in reports)
        self._births.end()
        self._last = SpoolState(workloads, scan.rejected, scan.overflow, scan.removed, scan.stale)
        values = tuple(w if w.training is None else replace(w, training=with_zeros(w.training)) for w in reports)
        self._unheld = (self._last, replace(self._last, workloads=values))
        self._log_arrivals(self._last.workloads)
        return Update(self._last)

    def _held(self, w: WorkloadReport) -> WorkloadReport:
        """A workload's counters as they may be served: each new series (a new process's all: a restart is a reset
        Prometheus sees) at 0 until a scrape has served it (jaxmon.births). The compile counters are the process's
        (the same through its publishers), the training counters its tracker's (new with a new tracker)."""
        started = w.started if w.process_started is None else w.process_started
        process = (w.workload, w.process_index, w.host, w.pid, started)
        compile_ = self._births.compile(process, w.compile)
        if w.training is None:
            return replace(w, compile=compile_)
        tracker = (*process, "tracker", round(w.training.start_time_seconds, 3))
        return replace(w, compile=compile_, training=self._births.training(tracker, with_zeros(w.training)))

    def unheld(self, state: SpoolState) -> SpoolState:
        """The workloads' counters at their values (what readers other than Prometheus are served)."""
        held, values = self._unheld
        return values if state is held and values is not None else state

    def _log_arrivals(self, workloads: tuple[WorkloadReport, ...]) -> None:
        """Log each workload process that started or stopped reporting since the last scan."""
        now = {(w.workload, w.process_index, w.host, w.pid) for w in workloads}
        seen = self._seen
        for workload, process_index, host, pid in sorted(now - seen):
            log.info("workload appeared", workload=workload, process_index=process_index, host=host, pid=pid)
        for workload, process_index, host, pid in sorted(seen - now):
            log.info(
                "workload gone",
                workload=workload,
                process_index=process_index,
                host=host,
                pid=pid,
                reason=f"no report for --collector.spool.ttl ({self.reader.ttl:g}s) or its file was removed",
            )
        self._seen = now

    def families(self, snap: Snapshot, state: SpoolState) -> Iterator[Metric]:
        """Each workload's devices, compile counters and identity, and the rejected files."""
        info = metrics.DEVICE_INFO.new()
        rows: dict[frozenset[tuple[str, str]], tuple[MemoryRow, DeviceInfo]] = {}
        for w in state.workloads:
            for wd in w.devices:
                labels = {"device": str(wd.info.id), "platform": wd.info.platform, "workload": w.workload}
                # Never two samples with one label set, even if two reports claim the same device (two
                # independent processes under one workload name): the newest report (listed first) wins.
                row = MemoryRow(
                    labels,
                    wd.reading,
                    live_array_bytes=wd.live_array_bytes,
                    replicated_array_bytes=wd.replicated_array_bytes,
                    host_array_bytes=wd.host_array_bytes,
                )
                rows.setdefault(frozenset(labels.items()), (row, wd.info))
        for row, dev in rows.values():
            add(info, {**row.labels, **dev.identity_labels(), "source": "spool"}, 1)
        yield info
        yield from memory_families([row for row, _ in rows.values()])
        yield from compile_families(
            [({"workload": w.workload, "process_index": str(w.process_index)}, w.compile) for w in state.workloads]
        )
        yield from training_families(
            [(training_labels(w.workload, w.process_index, w.process_count, w.host), w.training)
             for w in state.workloads if w.training is not None]
        )  # fmt: skip
        yield from checkpoint_families(
            [(training_labels(w.workload, w.process_index, w.process_count, w.host), w.checkpoint)
             for w in state.workloads if w.checkpoint is not None]
        )  # fmt: skip
        workload_info = metrics.WORKLOAD_INFO.new()
        last = metrics.WORKLOAD_LAST_REPORT_TIMESTAMP_SECONDS.new()
        for w in state.workloads:
            ident = {"workload": w.workload, "process_index": str(w.process_index)}
            identity = {"host": w.host, "pid": str(w.pid), "jax_version": w.jax_version, **w.scheduler}
            add(workload_info, {**ident, **identity}, 1)
            add(last, ident, w.time)
        yield workload_info
        yield last
        rejected = metrics.SPOOL_REJECTED_FILES.new()
        for reason, count in sorted(state.rejected.items()):
            add(rejected, {"reason": reason}, float(count))
        yield rejected
        overflow = metrics.SPOOL_OVERFLOW_FILES.new()
        for reason, count in sorted(state.overflow.items()):
            add(overflow, {"reason": reason}, float(count))
        yield overflow
        removed = metrics.SPOOL_REMOVED_FILES.new()
        for kind, count in sorted(state.removed.items()):
            add(removed, {"kind": kind}, float(count))
        yield removed
        if state.stale is not None:
            stale = metrics.SPOOL_STALE_FILES.new()
            add(stale, {}, float(state.stale))
            yield stale
