"""The spool: snapshots that workload processes publish into a shared directory, and the sidecar's reader.

One file per publishing process, replaced atomically (write a hidden temporary file in the same directory, fsync,
`os.replace`), so a reader sees the old file or the new one, never a torn one. The reader trusts nothing: files
that are not what a publisher writes are skipped and counted by reason.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from jaxmon.logsetup import ErrorLog

log = structlog.get_logger("jaxmon.sources.spool")

# What publishers write now, and every schema the reader still reads (a sidecar newer than its trainers).
SCHEMA: Literal["jaxmon.spool/2"] = "jaxmon.spool/2"
SCHEMAS = ("jaxmon.spool/1", SCHEMA)
DEFAULT_MAX_FILE_BYTES = 1 << 20
REJECT_REASONS = (
    "symlink",
    "not_a_file",
    "oversized",
    "unreadable",
    "bad_json",
    "schema_version",
    "bad_schema",
    "name",
    "error",
)
# Why live files were left unread in a poll: past --spool.max-workloads, or past the per-poll read budget.
OVERFLOW_REASONS = ("max_workloads", "read_budget")
# What the sidecar removed: stale publisher files and orphaned temporary files of crashed writers.
REMOVED_KINDS = ("json", "tmp")
# 3000-01-01: a `time` or `started` later than this is a broken clock or a forged file, not a report.
MAX_TIME = 32503680000.0
INT64_MAX = 2**63 - 1
# What a publisher names its file (`<workload>.<host>.<pid>.json`) and the temporary file it writes first
# (`write_atomically`: mkstemp's prefix + 8 random characters + suffix). Only such files are ever removed.
FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.[0-9]+\.json$")
TMP_NAME = re.compile(r"^\.[A-Za-z0-9_.-]+\.[0-9]+\.json\.[A-Za-z0-9_]+\.tmp$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """A file-name-safe form of a workload or host name."""
    cleaned = _SAFE.sub("_", text).strip("._")
    return cleaned[:100] or "workload"


# -- the published document -----------------------------------------------------------------------------

# Every number in a document fits int64 (or is a finite double): 10**400 is a Python int that no float holds,
# and would fail every render that turned it into a sample value.
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Float64 = Annotated[float, Field(ge=-(2.0**63), le=2.0**63)]
Timestamp = Annotated[float, Field(ge=0, le=MAX_TIME)]
StatKey = Annotated[str, Field(min_length=1, max_length=128)]
# allow_inf_nan=False: JSON has no Infinity or NaN, and Python's json module accepts them anyway.
_MODEL = ConfigDict(extra="forbid", allow_inf_nan=False)


class SpoolDevice(BaseModel):
    """One device of one publishing process."""

    model_config = _MODEL

    id: Count
    platform: str = Field(min_length=1, max_length=64)
    device_kind: str = Field(default="unknown", max_length=256)
    process_index: Count = 0
    coords: str | None = Field(default=None, max_length=64)
    core_on_chip: Count | None = None
    memory_stats: dict[StatKey, Int64 | Float64 | None] | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, max_length=4096)
    live_array_bytes: Count | None = None
    num_cores: Count | None = None  # schema 2


class SpoolCompile(BaseModel):
    """Compile counters of one process since it started publishing."""

    model_config = _MODEL

    compilations: Count = 0
    compile_seconds: float = Field(default=0.0, ge=0, le=2.0**63)
    cache_hits: Count = 0
    cache_misses: Count = 0


NonNegative = Annotated[float, Field(ge=0, le=2.0**63)]
Kind = Annotated[str, Field(min_length=1, max_length=64)]


class SpoolDeviceTraining(BaseModel):
    """One device's training FLOPs and utilization (schema 2)."""

    model_config = _MODEL

    platform: str = Field(min_length=1, max_length=64)
    id: Count
    model_flops_total: NonNegative | None = None
    hardware_flops_total: NonNegative | None = None
    hardware_bytes_total: NonNegative | None = None
    peak_flops: NonNegative | None = None
    peak_source: Literal["table", "setting"] | None = None
    mfu: NonNegative | None = None
    hfu: NonNegative | None = None


class SpoolTraining(BaseModel):
    """A workload process's training telemetry (schema 2; jaxmon.training.reading.TrainingReading)."""

    model_config = _MODEL

    steps_total: Count = 0
    step: Int64 | None = None
    dispatched_step: Int64 | None = None
    last_step_timestamp: Timestamp | None = None
    # (upper bound, cumulative count) of the finite buckets; the +Inf bucket is duration_count (JSON has no inf).
    duration_buckets: list[tuple[Annotated[float, Field(gt=0)], Count]] = Field(default_factory=list, max_length=64)
    duration_count: Count = 0
    duration_sum: NonNegative = 0.0
    examples_total: NonNegative = 0.0
    tokens_total: NonNegative = 0.0
    host_wait_seconds_total: NonNegative = 0.0
    elapsed_seconds: NonNegative = 0.0
    productive_seconds_total: NonNegative = 0.0
    badput_seconds_total: dict[Kind, NonNegative] = Field(default_factory=dict, max_length=64)
    devices: list[SpoolDeviceTraining] = Field(default_factory=list, max_length=4096)
    problems: dict[Kind, Count] = Field(default_factory=dict, max_length=16)

    @model_validator(mode="after")
    def _a_histogram(self) -> SpoolTraining:
        # Bounds rise and counts never fall: anything else is no histogram (promtool check metrics refuses it).
        bounds = [b for b, _ in self.duration_buckets]
        counts = [c for _, c in self.duration_buckets] + [self.duration_count]
        if bounds != sorted(set(bounds)) or counts != sorted(counts):
            raise ValueError("duration_buckets must rise in bound and never fall in count, up to duration_count")
        return self


class SpoolDocument(BaseModel):
    """What a publisher writes."""

    model_config = _MODEL

    schema_: Literal["jaxmon.spool/1", "jaxmon.spool/2"] = Field(alias="schema")
    workload: str = Field(min_length=1, max_length=200)
    host: str = Field(min_length=1, max_length=255)
    pid: Count
    process_index: Count
    jax_version: str = Field(max_length=64)
    time: Timestamp
    started: Timestamp
    interval: float = Field(gt=0, le=86400)
    devices: list[SpoolDevice] = Field(max_length=4096)
    compile: SpoolCompile = SpoolCompile()
    training: SpoolTraining | None = None  # schema 2: absent before the process's first jaxmon.step()
    process_count: Count | None = None  # schema 2: jax.process_count()
    # schema 2: where the scheduler put the process (jaxmon.identity.scheduler_labels: pod, namespace, node, ...)
    scheduler: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,32}$")], Annotated[str, Field(max_length=253)]] = Field(
        default_factory=dict, max_length=8
    )


# -- the reader -----------------------------------------------------------------------------------------


class Rejected(Exception):
    """A spool file that is not what a publisher writes."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} (JSON has no such numbers)")


def read_document(path: Path, max_bytes: int) -> SpoolDocument:
    """Open one spool file safely (no symlinks, regular files only, bounded size) and validate it."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise Rejected("unreadable", str(exc)) from exc
    if stat.S_ISLNK(st.st_mode):
        raise Rejected("symlink", "symbolic links are not followed")
    if not stat.S_ISREG(st.st_mode):
        raise Rejected("not_a_file", "not a regular file")
    if st.st_size > max_bytes:
        raise Rejected("oversized", f"{st.st_size} bytes, limit {max_bytes}")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped between lstat and open
                raise Rejected("not_a_file", "not a regular file")
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise Rejected("unreadable", str(exc)) from exc
    if len(raw) > max_bytes:
        raise Rejected("oversized", f"more than {max_bytes} bytes")
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        # The C decoder counts nesting against the recursion limit and raises cleanly (Modules/_json.c).
        raise Rejected("bad_json", "nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected("bad_json", str(exc)) from exc
    if not isinstance(data, dict):
        raise Rejected("bad_schema", "top level is not an object")
    if data.get("schema") not in SCHEMAS:
        expected = " or ".join(repr(s) for s in SCHEMAS)
        raise Rejected("schema_version", f"schema {str(data.get('schema'))[:64]!r}, expected {expected}")
    try:
        return SpoolDocument.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Rejected("bad_schema", f"{where}: {first['msg']}") from exc


T = TypeVar("T")


@dataclass(frozen=True)
class Live(Generic[T]):
    """One live spool file: what `derive` made of its document, and when it was last written."""

    name: str
    key: tuple[str, str, int]  # workload, host, process index
    started: float
    mtime: float
    value: T


@dataclass
class _Entry(Generic[T]):
    stamp: tuple[int, int, int]  # inode, mtime_ns, size: any rewrite changes it
    first_seen: float  # reader's monotonic clock when this stamp was first seen
    outcome: Live[T] | str | None = None  # the derived report, a reject reason, or None: not read (yet)


@dataclass(frozen=True)
class Scan(Generic[T]):
    """One poll of the spool directory."""

    live: list[Live[T]]
    stale: int  # files past the TTL still in the directory (.json, and orphaned .tmp of crashed writers)
    rejected: dict[str, int] = field(default_factory=dict)  # cumulative, by reason
    overflow: dict[str, int] = field(default_factory=dict)  # cumulative, live files left unread, by reason
    removed: dict[str, int] = field(default_factory=dict)  # cumulative, by kind


class SpoolReader(Generic[T]):
    """Reads the spool directory: every file read and derived inside its own guard, everything bounded.

    A file is live while it was written within the TTL on this reader's clock: its mtime is no older than the TTL
    and this reader saw it change within the TTL (so neither a document's own `time` nor a file whose mtime lies
    in the future keeps a silent workload alive). Files are visited in name order; at most `max_workloads` live
    files are shown and at most `reads_per_poll` files are (re)read per poll, the rest counted as overflow, so a
    poll's cost and the exposition's size are bounded whatever lands in the directory. Stale publisher files and
    orphaned temporary files older than `remove_after` are removed where this reader may write, else counted.
    """

    def __init__(
        self,
        directory: Path,
        ttl: float,
        derive: Callable[[SpoolDocument], T],
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_workloads: int = 128,
        reads_per_poll: int = 256,
        remove_after: float | None = None,
        error_interval: float = 60.0,
    ) -> None:
        self.directory = directory
        self.ttl = ttl
        self.derive = derive
        self.max_file_bytes = max_file_bytes
        self.max_workloads = max_workloads
        self.reads_per_poll = reads_per_poll
        self.remove_after = 10 * ttl if remove_after is None else remove_after
        self._may_remove = True
        self._errors = ErrorLog(log, error_interval)
        self._cache: dict[str, _Entry[T]] = {}
        self._lock = threading.Lock()
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.overflow: dict[str, int] = dict.fromkeys(OVERFLOW_REASONS, 0)
        self.removed: dict[str, int] = dict.fromkeys(REMOVED_KINDS, 0)

    def scan(self, now: float | None = None, mono: float | None = None) -> Scan[T]:
        """The live files, newest start per (workload, host, process index); raises OSError if the directory
        itself cannot be listed."""
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        with self._lock:
            removed_before = sum(self.removed.values())
            listed: list[tuple[str, str, os.stat_result]] = []
            stale = 0
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed since listing
                    if entry.name.startswith("."):
                        # A publisher's temporary file (or a hidden file): never read; a crashed writer's is stale.
                        if TMP_NAME.match(entry.name) and stat.S_ISREG(st.st_mode) and now - st.st_mtime > self.ttl:
                            stale += 0 if self._remove_if_old(entry.path, st, now, "tmp") else 1
                        continue
                    listed.append((entry.name, entry.path, st))
            listed.sort()
            seen: set[str] = set()
            live: list[Live[T]] = []
            reads = 0
            for name, path, st in listed:
                seen.add(name)
                stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
                entry_ = self._cache.get(name)
                if entry_ is None or entry_.stamp != stamp:
                    entry_ = self._cache[name] = _Entry(stamp, mono)
                regular = stat.S_ISREG(st.st_mode)
                age = max(now - st.st_mtime, mono - entry_.first_seen)
                if regular and name.endswith(".json") and age > self.ttl:
                    if isinstance(entry_.outcome, Live):
                        entry_.outcome = None  # free the report; a rewrite is a new stamp and is read again
                    if not (FILE_NAME.match(name) and self._remove_if_old(path, st, now, "json")):
                        stale += 1
                    continue
                if entry_.outcome is None:
                    if len(live) >= self.max_workloads:
                        self.overflow["max_workloads"] += 1
                        continue
                    if reads >= self.reads_per_poll:
                        self.overflow["read_budget"] += 1
                        continue
                    reads += 1
                    entry_.outcome = self._load(name, Path(path), st)
                if isinstance(entry_.outcome, Live):
                    if len(live) >= self.max_workloads:
                        self.overflow["max_workloads"] += 1
                        entry_.outcome = None  # not shown: do not keep its report
                        continue
                    live.append(entry_.outcome)  # its mtime is the file's: the stamp holds mtime_ns
            for gone in set(self._cache) - seen:
                del self._cache[gone]
            removed = sum(self.removed.values()) - removed_before
            if removed:
                log.info("removed stale spool files", files=removed, older_than_seconds=self.remove_after)
            # A restarted process replaces its predecessor: keep the latest start per (workload, host, index).
            newest: dict[tuple[str, str, int], Live[T]] = {}
            for r in live:
                if r.key not in newest or (r.started, r.mtime) > (newest[r.key].started, newest[r.key].mtime):
                    newest[r.key] = r
            return Scan(
                live=sorted(newest.values(), key=lambda r: r.key),
                stale=stale,
                rejected=dict(self.rejected),
                overflow=dict(self.overflow),
                removed=dict(self.removed),
            )

    def _load(self, name: str, path: Path, st: os.stat_result) -> Live[T] | str:
        """Read, validate and derive one file; any exception rejects the file (counted, logged once)."""
        try:
            if not name.endswith(".json"):
                raise Rejected("name", "not a .json file")
            doc = read_document(path, self.max_file_bytes)
            value = self.derive(doc)
            return Live(name, (doc.workload, doc.host, doc.process_index), doc.started, st.st_mtime, value)
        except Rejected as exc:
            reason, detail = exc.reason, str(exc)
        except Exception as exc:  # a file must never stop the poll: whatever it does, it is one rejected file
            reason, detail = "error", f"{type(exc).__name__}: {str(exc)[:512]}"
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        log.warning("spool file rejected", file=str(path), reason=reason, detail=detail[:1024])
        return reason

    def _remove_if_old(self, path: str, st: os.stat_result, now: float, kind: str) -> bool:
        """Remove a stale publisher file older than `remove_after`; False when it stays (young, or read-only)."""
        if not self._may_remove or now - st.st_mtime <= self.remove_after:
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True  # its publisher (or another reader) removed it first
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                # A read-only mount: say so once and stop trying; stale files are still counted.
                self._may_remove = False
                log.info("spool directory is not writable here; stale files are counted, not removed", error=str(exc))
            else:
                self._errors.error("remove", "cannot remove stale spool file", str(exc), same=type(exc).__name__)
            return False
        self.removed[kind] += 1
        return True
