"""The spool: snapshots that workload processes publish into a shared directory, and the sidecar's reader.

One file per publishing process, replaced atomically (write a hidden temporary file in the same directory, fsync,
`os.replace`), so a reader sees the old file or the new one, never a torn one. The reader trusts nothing: files
that are not what a publisher writes are skipped and counted by reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = structlog.get_logger("jaxmon.sources.spool")

SCHEMA = "jaxmon.spool/1"
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
)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """A file-name-safe form of a workload or host name."""
    cleaned = _SAFE.sub("_", text).strip("._")
    return cleaned[:100] or "workload"


# -- the published document -----------------------------------------------------------------------------


class SpoolDevice(BaseModel):
    """One device of one publishing process."""

    model_config = ConfigDict(extra="forbid")

    id: int = Field(ge=0)
    platform: str = Field(min_length=1, max_length=64)
    device_kind: str = Field(default="unknown", max_length=256)
    process_index: int = Field(default=0, ge=0)
    coords: str | None = Field(default=None, max_length=64)
    core_on_chip: int | None = None
    memory_stats: dict[str, int | float | None] | None = None
    error: str | None = Field(default=None, max_length=4096)
    live_array_bytes: int | None = Field(default=None, ge=0)


class SpoolCompile(BaseModel):
    """Compile counters of one process since it started publishing."""

    model_config = ConfigDict(extra="forbid")

    compilations: int = Field(default=0, ge=0)
    compile_seconds: float = Field(default=0.0, ge=0)
    cache_hits: int = Field(default=0, ge=0)
    cache_misses: int = Field(default=0, ge=0)


class SpoolDocument(BaseModel):
    """What a publisher writes."""

    model_config = ConfigDict(extra="forbid")

    schema_: Literal["jaxmon.spool/1"] = Field(alias="schema")
    workload: str = Field(min_length=1, max_length=200)
    host: str = Field(min_length=1, max_length=255)
    pid: int = Field(ge=0)
    process_index: int = Field(ge=0)
    jax_version: str = Field(max_length=64)
    time: float
    started: float
    interval: float = Field(gt=0)
    devices: list[SpoolDevice] = Field(max_length=4096)
    compile: SpoolCompile = SpoolCompile()


def write_atomically(path: Path, payload: Mapping[str, Any]) -> None:
    """Replace `path` with `payload` as JSON so that no reader ever sees a partial file."""
    data = json.dumps(payload, separators=(",", ":")).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- the reader -----------------------------------------------------------------------------------------


class Rejected(Exception):
    """A spool file that is not what a publisher writes."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


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
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected("bad_json", str(exc)) from exc
    if not isinstance(data, dict):
        raise Rejected("bad_schema", "top level is not an object")
    if data.get("schema") != SCHEMA:
        raise Rejected("schema_version", f"schema {data.get('schema')!r}, expected {SCHEMA!r}")
    try:
        return SpoolDocument.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Rejected("bad_schema", f"{where}: {first['msg']}") from exc


@dataclass
class _Cached:
    key: tuple[int, int, int]
    report: SpoolDocument | None
    reason: str | None


class SpoolReader:
    """Reads the spool directory; re-parses a file only when it changed; drops workloads past the TTL."""

    def __init__(self, directory: Path, ttl: float, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.directory = directory
        self.ttl = ttl
        self.max_file_bytes = max_file_bytes
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)

    def scan(self, now: float | None = None) -> list[SpoolDocument]:
        """The newest report of every live (workload, host, process index); raises OSError if the directory
        itself cannot be listed."""
        now = time.time() if now is None else now
        with self._lock:
            seen: set[str] = set()
            reports: list[SpoolDocument] = []
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue  # a publisher's temporary file, or hidden files
                    seen.add(entry.name)
                    report = self._read(entry)
                    if report is not None and now - report.time <= self.ttl:
                        reports.append(report)
            for gone in set(self._cache) - seen:
                del self._cache[gone]
        # A restarted process replaces its predecessor: keep the latest start per (workload, host, index).
        newest: dict[tuple[str, str, int], SpoolDocument] = {}
        for r in reports:
            key = (r.workload, r.host, r.process_index)
            if key not in newest or (r.started, r.time) > (newest[key].started, newest[key].time):
                newest[key] = r
        return sorted(newest.values(), key=lambda r: (r.workload, r.host, r.process_index))

    def _read(self, entry: os.DirEntry[str]) -> SpoolDocument | None:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return None  # removed since listing
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache.get(entry.name)
        if cached is not None and cached.key == key:
            return cached.report
        path = Path(entry.path)
        try:
            if not entry.name.endswith(".json"):
                raise Rejected("name", "not a .json file")
            if time.time() - st.st_mtime > self.ttl and stat.S_ISREG(st.st_mode):
                # Stale: skip without parsing; it cannot report a live workload.
                self._cache[entry.name] = _Cached(key, None, None)
                return None
            report: SpoolDocument | None = read_document(path, self.max_file_bytes)
            reason = None
        except Rejected as exc:
            report, reason = None, exc.reason
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            log.warning("spool file rejected", file=str(path), reason=reason, detail=str(exc))
        self._cache[entry.name] = _Cached(key, report, reason)
        return report
