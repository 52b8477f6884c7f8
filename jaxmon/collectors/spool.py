"""The spool collector: what every workload process published (`jaxmon.publish`), labelled by workload.

The reader (`jaxmon.sources.spool`) validates each file and, inside the same per-file guard, calls
`workload_report` here to turn it into the same memory and compile numbers an embedded exporter has; a file that
fails either step is one rejected file, never a failed poll. This adds each workload process's identity and what
the reader had to reject, leave unread or remove.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

import structlog
from prometheus_client.core import Metric

from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, CollectorOptions, Context, Enabled, Update, add, family
from jaxmon.collectors.compile import compile_families
from jaxmon.collectors.memory import MemoryRow, memory_families
from jaxmon.logsetup import ErrorLog
from jaxmon.memory import memory_numbers
from jaxmon.model import DeviceInfo, MemoryReading
from jaxmon.snapshot import Snapshot
from jaxmon.sources.spool import SpoolDocument, SpoolReader

log = structlog.get_logger("jaxmon.collectors.spool")


@dataclass(frozen=True)
class WorkloadDevice:
    """One device as a workload reported it, with the numbers jaxmon derives."""

    info: DeviceInfo
    reading: MemoryReading
    live_array_bytes: int | None


@dataclass(frozen=True)
class WorkloadReport:
    """The latest snapshot of one workload process."""

    workload: str
    host: str
    pid: int
    process_index: int
    jax_version: str
    time: float  # the file's mtime on the reader's clock, set per scan (the document's own `time` is not trusted)
    started: float
    devices: tuple[WorkloadDevice, ...]
    compile: Mapping[str, float]


def workload_report(doc: SpoolDocument) -> WorkloadReport:
    """The numbers of one published document."""
    devices = []
    for d in doc.devices:
        info = DeviceInfo(
            id=d.id,
            platform=d.platform,
            device_kind=d.device_kind,
            process_index=d.process_index,
            coords=d.coords,
            core_on_chip=d.core_on_chip,
        )
        if d.error is not None:
            reading = MemoryReading(numbers=None, error=d.error)
        else:
            reading = MemoryReading(numbers=memory_numbers(d.memory_stats))
        devices.append(WorkloadDevice(info=info, reading=reading, live_array_bytes=d.live_array_bytes))
    return WorkloadReport(
        workload=doc.workload,
        host=doc.host,
        pid=doc.pid,
        process_index=doc.process_index,
        jax_version=doc.jax_version,
        time=doc.time,
        started=doc.started,
        devices=tuple(devices),
        compile=doc.compile.model_dump(),
    )


@dataclass(frozen=True)
class SpoolState:
    """The latest report of every live workload process, and what the reader rejected, skipped and removed."""

    workloads: tuple[WorkloadReport, ...] = ()
    rejected: Mapping[str, int] = field(default_factory=dict)
    overflow: Mapping[str, int] = field(default_factory=dict)
    removed: Mapping[str, int] = field(default_factory=dict)
    stale: int | None = None  # None: the directory could not be listed


class SpoolOptions(CollectorOptions):
    """`--collector.spool`: on when `--spool.dir` is set."""

    enabled: Enabled = "auto"


@register
class SpoolCollector(Collector[SpoolState]):
    """Workload snapshots from the spool directory."""

    name = "spool"
    description = "Workload processes' snapshots published to --spool.dir (jaxmon.publish)."
    options = SpoolOptions
    order = 40
    # The spool is other processes' files: a slow or huge directory must not make this process's own liveness
    # fail (/healthz restarts the sidecar, which fixes nothing). jaxmon_collector_success says how it goes.
    heartbeat = False

    @classmethod
    def unavailable(cls, ctx: Context) -> str | None:
        """Needs a spool directory."""
        return None if ctx.settings.spool.dir is not None else "no --spool.dir given"

    def __init__(self, ctx: Context, options: CollectorOptions) -> None:
        super().__init__(ctx, options)
        spool = ctx.settings.spool
        assert spool.dir is not None  # unavailable() otherwise
        self.reader: SpoolReader[WorkloadReport] = SpoolReader(
            spool.dir,
            spool.ttl,
            workload_report,
            max_file_bytes=spool.max_file_bytes,
            max_workloads=spool.max_workloads,
            reads_per_poll=spool.max_reads_per_poll,
            remove_after=spool.remove_after,
        )
        self._errors = ErrorLog(log)
        self._last = SpoolState(
            rejected=dict(self.reader.rejected), overflow=dict(self.reader.overflow), removed=dict(self.reader.removed)
        )
        self._seen: set[tuple[str, int, str, int]] = set()  # (workload, process_index, host, pid) last scan

    def update(self) -> Update[SpoolState]:
        """Scan the directory; when it cannot be listed, keep serving the last good workloads and say so."""
        directory = str(self.reader.directory)
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
        workloads = tuple(replace(f.value, time=f.mtime) for f in scan.live)
        self._last = SpoolState(workloads, scan.rejected, scan.overflow, scan.removed, scan.stale)
        self._log_arrivals(self._last.workloads)
        return Update(self._last)

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
                reason=f"no report for --spool.ttl ({self.reader.ttl:g}s) or its file was removed",
            )
        self._seen = now

    def families(self, snap: Snapshot, state: SpoolState) -> Iterator[Metric]:
        """Each workload's devices, compile counters and identity, and the rejected files."""
        info = family("jaxmon_device_info", "Identity of each device; always 1.")
        rows: dict[frozenset[tuple[str, str]], tuple[MemoryRow, DeviceInfo]] = {}
        for w in state.workloads:
            for wd in w.devices:
                labels = {"device": str(wd.info.id), "platform": wd.info.platform, "workload": w.workload}
                # Never two samples with one label set, even if two reports claim the same device (two
                # independent processes under one workload name): the newest report (listed first) wins.
                rows.setdefault(
                    frozenset(labels.items()), (MemoryRow(labels, wd.reading, None, wd.live_array_bytes), wd.info)
                )
        for row, dev in rows.values():
            add(info, {**row.labels, **device_identity_labels(dev), "source": "spool"}, 1)
        yield info
        yield from memory_families([row for row, _ in rows.values()])
        yield from compile_families(
            [({"workload": w.workload, "process_index": str(w.process_index)}, w.compile) for w in state.workloads]
        )
        workload_info = family("jaxmon_workload_info", "Each workload process reporting to the spool; always 1.")
        last = family(
            "jaxmon_workload_last_report_timestamp_seconds",
            "Unix time the workload process last wrote its spool file (the file's mtime on the sidecar's clock).",
        )
        for w in state.workloads:
            ident = {"workload": w.workload, "process_index": str(w.process_index)}
            add(workload_info, {**ident, "host": w.host, "pid": str(w.pid), "jax_version": w.jax_version}, 1)
            add(last, ident, w.time)
        yield workload_info
        yield last
        rejected = family(
            "jaxmon_spool_rejected_files", "Spool files skipped because they are not what a publisher writes.", True
        )
        for reason, count in sorted(state.rejected.items()):
            add(rejected, {"reason": reason}, float(count))
        yield rejected
        overflow = family(
            "jaxmon_spool_overflow_files",
            "Live spool files left unread in a poll: past --spool.max-workloads, or past --spool.max-reads-per-poll "
            "(read at a later poll); counted every poll they are left out.",
            True,
        )
        for reason, count in sorted(state.overflow.items()):
            add(overflow, {"reason": reason}, float(count))
        yield overflow
        removed = family(
            "jaxmon_spool_removed_files",
            "Stale publisher files (json) and crashed writers' temporary files (tmp) the sidecar removed.",
            True,
        )
        for kind, count in sorted(state.removed.items()):
            add(removed, {"kind": kind}, float(count))
        yield removed
        if state.stale is not None:
            stale = family(
                "jaxmon_spool_stale_files",
                "Files in the spool directory past --spool.ttl and not (yet) removed, orphaned temporary files "
                "included.",
            )
            add(stale, {}, float(state.stale))
            yield stale


def device_identity_labels(d: DeviceInfo) -> dict[str, str]:
    """The identity labels of jaxmon_device_info besides device, platform, workload and source."""
    return {
        "device_kind": d.device_kind,
        "process_index": str(d.process_index),
        "coords": d.coords or "",
        "core_on_chip": "" if d.core_on_chip is None else str(d.core_on_chip),
    }
