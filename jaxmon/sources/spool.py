"""The spool: snapshots that workload processes publish into a shared directory, and the sidecar's reader.

One file per publishing process, replaced atomically (write a hidden temporary file in the same directory, fsync,
`os.replace`), so a reader sees the old file or the new one, never a torn one. The reader trusts nothing: files
that are not what a publisher writes are skipped and counted by reason.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import structlog

from jaxmon.logsetup import ErrorLog
from jaxmon.sources.spool_document import (  # re-exported: the spool's format, read here
    REJECT_REASONS,
    Rejected,
    SpoolDocument,
    read_document,
)

log = structlog.get_logger("jaxmon.sources.spool")

DEFAULT_MAX_FILE_BYTES = 1 << 20
# Why live files were left unread in a poll: past --spool.max-workloads, or past the per-poll read budget.
OVERFLOW_REASONS = ("max_workloads", "read_budget")
# What the sidecar removed: stale publisher files and orphaned temporary files of crashed writers.
REMOVED_KINDS = ("json", "tmp")
# What a publisher names its file (`<workload>.<host>.<pid>.json`) and the temporary file it writes first
# (`write_atomically`: mkstemp's prefix + 8 random characters + suffix). Only such files are ever removed.
FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.[0-9]+\.json$")
TMP_NAME = re.compile(r"^\.[A-Za-z0-9_.-]+\.[0-9]+\.json\.[A-Za-z0-9_]+\.tmp$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """A file-name-safe form of a workload or host name."""
    cleaned = _SAFE.sub("_", text).strip("._")
    return cleaned[:100] or "workload"


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
