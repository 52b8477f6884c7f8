"""The spool file's format: the document a publisher writes (schema `jaxmon.spool/3`; the reader also reads
`/1` and `/2`), and reading one file safely.

Versioning: every model forbids unknown fields, so a field a publisher adds is a new schema version (a reader that
does not know the version says so, `schema_version`, rather than `bad_schema`), and the reader keeps reading every
older version (a sidecar is upgraded before, or with, its trainers). Schema 3 adds, per device, the replicated and
host-memory array bytes and, per device of `training`, the collective bytes by (op, axes) and the programs'
predicted peak memory, and the loss gauge (`training.loss`, `training.loss_step`: a /3 document of a publisher
before it has none, and reads as having no loss); a /1 or /2 document reads as before.

Every bound a forged file could break is in the models; jaxmon.sources.spool is the reader of the directory."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# What publishers write now, and every schema the reader still reads (a sidecar newer than its trainers).
SCHEMA: Literal["jaxmon.spool/3"] = "jaxmon.spool/3"
SCHEMAS = ("jaxmon.spool/1", "jaxmon.spool/2", SCHEMA)
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
# 3000-01-01: a `time` or `started` later than this is a broken clock or a forged file, not a report.
MAX_TIME = 32503680000.0
INT64_MAX = 2**63 - 1


# -- the published document -----------------------------------------------------------------------------

# Every number in a document fits int64 (or is a finite double): 10**400 is a Python int that no float holds,
# and would fail every render that turned it into a sample value.
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Float64 = Annotated[float, Field(ge=-(2.0**63), le=2.0**63)]
Timestamp = Annotated[float, Field(ge=0, le=MAX_TIME)]
StatKey = Annotated[str, Field(min_length=1, max_length=128)]
MemoryKind = Annotated[str, Field(min_length=1, max_length=64)]  # a JAX memory kind: pinned_host, unpinned_host
# allow_inf_nan=False: JSON has no Infinity or NaN, and Python's json module accepts them anyway.
# protected_namespaces=(): `model_flops_total` is a field, not pydantic's; before 2.10 pydantic warned at import about
# any field named `model_*`.
_MODEL = ConfigDict(extra="forbid", allow_inf_nan=False, protected_namespaces=())


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
    # schema 3: the live arrays by placement (jaxmon.device_readings.ArrayBytes), on every device, whatever
    # memory_stats() says
    replicated_array_bytes: Count | None = None
    host_array_bytes: dict[MemoryKind, Count] | None = Field(default=None, max_length=8)  # bytes per memory kind


class SpoolCompile(BaseModel):
    """Compile counters of one process since it started publishing.

    `cache_misses` counts compilations that found nothing in the persistent cache (JAX's requests - hits,
    jaxmon.sources.local.workload.CompileCounters). Publishers before that counted JAX's `cache_misses` event,
    entries written: their documents stay valid and read the same, with that (lower) count.
    """

    model_config = _MODEL

    compilations: Count = 0
    compile_seconds: float = Field(default=0.0, ge=0, le=2.0**63)
    cache_hits: Count = 0
    cache_misses: Count = 0


NonNegative = Annotated[float, Field(ge=0, le=2.0**63)]
Kind = Annotated[str, Field(min_length=1, max_length=64)]
# A loss value as read: a finite double, or the non-finite ones spelled as Prometheus does (JSON has no NaN or inf).
LossValue = Literal["NaN", "+Inf", "-Inf"] | float


class SpoolCollectiveBytes(BaseModel):
    """Bytes the tracked programs' collectives of one op moved on one device over some mesh axes (schema 3)."""

    model_config = _MODEL

    op: str = Field(pattern=r"^[a-z][a-z0-9-]{0,63}$")
    axes: str = Field(default="", max_length=256)
    # The slowest link the groups cross (jaxmon.training.links); a publisher before it wrote none: not known.
    link: Literal["local", "nvlink", "ici", "pcie", "sys", "dcn", "network", "unknown"] = "unknown"
    bytes: NonNegative


class SpoolPlacedCollective(SpoolCollectiveBytes):
    """A sampled trace's collectives of one (op, axes, link) on one device: time run, exposed time and bytes."""

    seconds: NonNegative = 0.0
    exposed_seconds: NonNegative = 0.0


class SpoolCopy(BaseModel):
    """A sampled trace's copies of one direction on one device: the `copy` part's seconds and the bytes (where the
    trace says them)."""

    model_config = _MODEL

    seconds: NonNegative = 0.0
    bytes: NonNegative = 0.0


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
    collective_bytes_total: list[SpoolCollectiveBytes] = Field(default_factory=list, max_length=1024)  # schema 3
    program_peak_memory_bytes: NonNegative | None = None  # schema 3
    link_bandwidth: dict[Literal["local", "nvlink", "ici", "pcie", "sys", "dcn", "network"], NonNegative] = Field(
        default_factory=dict
    )


class SpoolDeviceProfile(BaseModel):
    """One device's time in the sampled traces (jaxmon.training_readings.DeviceProfile)."""

    model_config = _MODEL

    platform: str = Field(min_length=1, max_length=64)
    id: Count
    profiled_seconds_total: NonNegative = 0.0
    parts: dict[Literal["compute", "collective", "copy", "idle"], NonNegative] = Field(default_factory=dict)
    collectives: dict[Kind, NonNegative] = Field(default_factory=dict, max_length=16)
    placed: list[SpoolPlacedCollective] = Field(default_factory=list, max_length=1024)
    copies: dict[Literal["host_to_device", "device_to_host", "device_to_device", "other"], SpoolCopy] = Field(
        default_factory=dict
    )
    sample_wait_ratio: Annotated[float, Field(ge=0, le=1)] | None = None  # schema 3: the last sample's


class SpoolProfile(BaseModel):
    """The sampled traces of a training process (jaxmon.training_readings.ProfileReading)."""

    model_config = _MODEL

    results: dict[Literal["taken", "busy", "failed", "skipped"], Count] = Field(default_factory=dict)
    devices: list[SpoolDeviceProfile] = Field(default_factory=list, max_length=4096)
    sample_step: Int64 | None = None  # schema 3: the first step of the last sample taken


class SpoolTraining(BaseModel):
    """A workload process's training telemetry (schema 2; jaxmon.training_readings.TrainingReading)."""

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
    elapsed_seconds: NonNegative = 0.0  # seconds from the tracker's start to the document's time
    productive_seconds_total: NonNegative = 0.0
    badput_seconds_total: dict[Kind, NonNegative] = Field(default_factory=dict, max_length=64)
    devices: list[SpoolDeviceTraining] = Field(default_factory=list, max_length=4096)
    problems: dict[Kind, Count] = Field(default_factory=dict, max_length=16)
    profile: SpoolProfile | None = None  # sampled traces; absent when they are off (and before this field existed)
    # schema 3: the loss gauge by name (jaxmon.training_readings.bounded_loss's bounds) and the step it is of
    loss: dict[Kind, LossValue] = Field(default_factory=dict, max_length=16)
    loss_step: Int64 | None = None

    @model_validator(mode="after")
    def _a_histogram(self) -> SpoolTraining:
        # Bounds rise and counts never fall: anything else is no histogram (promtool check metrics refuses it).
        bounds = [b for b, _ in self.duration_buckets]
        counts = [c for _, c in self.duration_buckets] + [self.duration_count]
        if bounds != sorted(set(bounds)) or counts != sorted(counts):
            raise ValueError("duration_buckets must rise in bound and never fall in count, up to duration_count")
        return self


class SpoolCheckpoint(BaseModel):
    """The process's last checkpoint and the interval its job declared (jaxmon.checkpoints.CheckpointReading)."""

    model_config = _MODEL

    step: Int64 | None = None
    time: Timestamp | None = None
    interval_seconds: float | None = Field(default=None, gt=0, le=2.0**32)
    interval_steps: Count | None = None


class SpoolDocument(BaseModel):
    """What a publisher writes."""

    model_config = _MODEL

    schema_: Literal["jaxmon.spool/1", "jaxmon.spool/2", "jaxmon.spool/3"] = Field(alias="schema")
    workload: str = Field(min_length=1, max_length=200)
    host: str = Field(min_length=1, max_length=255)
    pid: Count
    process_index: Count
    jax_version: str = Field(max_length=64)
    time: Timestamp
    started: Timestamp
    # When the process started, as far as jaxmon saw it (its first import of the publisher): its compile counters
    # count from then, whatever publishers it started and stopped. Absent from older publishers (then `started`).
    process_started: Timestamp | None = None
    interval: float = Field(gt=0, le=86400)
    devices: list[SpoolDevice] = Field(max_length=4096)
    compile: SpoolCompile = SpoolCompile()
    training: SpoolTraining | None = None  # schema 2: absent before the process's first jaxmon.step()
    process_count: Count | None = None  # schema 2: jax.process_count()
    checkpoint: SpoolCheckpoint | None = None  # schema 3: absent from older publishers
    # schema 2: where the scheduler put the process (jaxmon.identity.scheduler_labels: pod, namespace, node, ...)
    scheduler: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,32}$")], Annotated[str, Field(max_length=253)]] = Field(
        default_factory=dict, max_length=8
    )


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
