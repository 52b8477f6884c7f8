"""The spool document's codec: what a publisher writes (`jaxmon.publish()`, jaxmon.publisher) and what the spool
collector reads back, beside the schema (jaxmon.sources.spool_document), so that every field of the document is
written and read in one place.

Writing: a device's identity, its raw `memory_stats()` (numbers only) or the error reading it, and the live arrays
by placement (`spool_device`); the training reading (`spool_training`: the +Inf bucket as the count, the start as
the seconds before the document's time, the collective bytes' (op, axes) keys as objects). Reading: the document as
a `WorkloadReport` (`workload_report`), with the allocator numbers jaxmon derives and the training reading as it was
made (`training_reading`); the loss' NaN and inf as "NaN", "+Inf" and "-Inf". tests/unit/sources/test_spool_codec.py
round-trips every field of schema 3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jaxmon.allocator import memory_numbers
from jaxmon.checkpoints import CheckpointReading
from jaxmon.device_readings import HOST_MEMORY_KINDS, ArrayBytes, DeviceInfo, MemoryReading
from jaxmon.sources.spool_document import SpoolCheckpoint, SpoolDevice, SpoolDocument, SpoolTraining
from jaxmon.training_readings import DeviceProfile, DeviceTraining, ProfileReading, TrainingReading

# The longest error text a document carries (SpoolDevice.error's bound).
MAX_ERROR = 4096


# -- writing -------------------------------------------------------------------------------------------------------


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def spool_device(
    device: DeviceInfo,
    stats: Mapping[str, Any] | None = None,
    error: str | None = None,
    arrays: ArrayBytes | None = None,
    arrays_error: str = "",
) -> SpoolDevice:
    """One device's entry: `stats` (its `memory_stats()`, None where it reports nothing: then the live arrays, from
    `arrays`, are its only memory figure, or `arrays_error` where they could not be read) or `error` (reading them
    failed), and every device's replicated and host-memory array bytes from `arrays` (none on a device: 0)."""
    fields: dict[str, Any] = device.identity()
    if error is not None:
        fields["error"] = error[:MAX_ERROR]
    elif stats is None:
        if arrays is None:
            fields["error"] = arrays_error[:MAX_ERROR]
        else:
            fields["live_array_bytes"] = arrays.live.get(device.key, 0)
    else:
        fields["memory_stats"] = {k: v for k, v in stats.items() if _number(v)}
    if arrays is not None:
        fields["replicated_array_bytes"] = arrays.replicated.get(device.key, 0)
        fields["host_array_bytes"] = {kind: arrays.host.get((device.key, kind), 0) for kind in HOST_MEMORY_KINDS}
    return SpoolDevice.model_validate(fields)


def spool_training(reading: TrainingReading, now: float) -> SpoolTraining:
    """The training reading as a spool document of time `now` carries it: the +Inf bucket is the count (JSON has no
    inf), the start is the seconds before `now` (elapsed_seconds, as schema 2 has always had it)."""
    finite = [(bound, count) for bound, count in reading.duration_buckets if bound != float("inf")]
    fields = asdict(reading)
    del fields["start_time_seconds"]
    fields.update(
        duration_buckets=finite,
        duration_count=reading.duration_count,
        elapsed_seconds=max(now - reading.start_time_seconds, 0.0),
    )
    fields["loss"] = {name: _loss_out(value) for name, value in reading.loss.items()}
    for device in fields["devices"]:  # (op, axes, link) keys as objects: JSON keys are strings only
        device["collective_bytes_total"] = [
            {"op": op, "axes": axes, "link": link, "bytes": n}
            for (op, axes, link), n in sorted(device["collective_bytes_total"].items())
        ]
    for device in (fields.get("profile") or {}).get("devices", []):
        device["placed"] = [
            {"op": op, "axes": axes, "link": link, "seconds": t, "exposed_seconds": e, "bytes": n}
            for (op, axes, link), (t, e, n) in sorted(device["placed"].items())
        ]
        device["copies"] = {k: {"seconds": t, "bytes": n} for k, (t, n) in sorted(device["copies"].items())}
    return SpoolTraining.model_validate(fields)


def _loss_out(value: float) -> float | str:
    """A loss value as the document carries it: NaN and inf spelled out (JSON has none)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


# -- reading -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadDevice:
    """One device as a workload reported it, with the numbers jaxmon derives."""

    info: DeviceInfo
    reading: MemoryReading
    live_array_bytes: int | None
    replicated_array_bytes: int | None = None  # schema 3
    host_array_bytes: Mapping[str, int] | None = None  # schema 3: bytes per host memory kind


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
    training: TrainingReading | None = None
    process_count: int | None = None
    scheduler: Mapping[str, str] = field(default_factory=dict)
    process_started: float | None = None  # None: an older publisher (its `started` stands for it)
    checkpoint: CheckpointReading | None = None


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
        devices.append(
            WorkloadDevice(
                info=info,
                reading=reading,
                live_array_bytes=d.live_array_bytes,
                replicated_array_bytes=d.replicated_array_bytes,
                host_array_bytes=d.host_array_bytes,
            )
        )
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
        training=None if doc.training is None else training_reading(doc.training, doc.time),
        process_count=doc.process_count,
        scheduler=dict(doc.scheduler),
        process_started=doc.process_started,
        checkpoint=None if doc.checkpoint is None else CheckpointReading(**doc.checkpoint.model_dump()),
    )


def training_reading(spooled: SpoolTraining, time: float) -> TrainingReading:
    """A published training section of a document written at `time` as the reading it was made from (+Inf bucket
    from the count, the start from the seconds elapsed by then)."""
    fields = spooled.model_dump()
    # To the millisecond: the difference of two floats near 1.8e9 varies in its last bits from one document to the
    # next, and a start time that changes is a restart to Prometheus (changes(), JaxmonTrainingRestarted).
    fields["start_time_seconds"] = round(time - fields.pop("elapsed_seconds"), 3)
    fields["duration_buckets"] = (
        (*((b, c) for b, c in spooled.duration_buckets), (float("inf"), spooled.duration_count))
        if spooled.duration_count or spooled.duration_buckets
        else ()
    )
    del fields["duration_count"]
    fields["loss"] = {name: float(value) for name, value in spooled.loss.items()}  # "NaN", "+Inf", "-Inf" too
    for d in fields["devices"]:
        d["collective_bytes_total"] = {(c["op"], c["axes"], c["link"]): c["bytes"] for c in d["collective_bytes_total"]}
    fields["devices"] = tuple(DeviceTraining(**d) for d in fields["devices"])
    if (profile := fields.get("profile")) is not None:
        fields["profile"] = ProfileReading(
            results=profile["results"],
            sample_step=profile["sample_step"],
            devices=tuple(
                DeviceProfile(
                    **{
                        **d,
                        "placed": {
                            (c["op"], c["axes"], c["link"]): (c["seconds"], c["exposed_seconds"], c["bytes"])
                            for c in d["placed"]
                        },
                        "copies": {k: (c["seconds"], c["bytes"]) for k, c in d["copies"].items()},
                    }
                )
                for d in profile["devices"]
            ),
        )
    return TrainingReading(**fields)


def spool_checkpoint(reading: CheckpointReading) -> SpoolCheckpoint | None:
    """A process's checkpoint reading as a document's section (None: nothing to say)."""
    if reading == CheckpointReading():
        return None
    return SpoolCheckpoint.model_validate(asdict(reading))
