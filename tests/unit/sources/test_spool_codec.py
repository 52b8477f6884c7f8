"""The spool document's codec (jaxmon/sources/spool_codec.py): every field of schema 3 written by the publisher's
encoders, through JSON as a file carries it, and read back by the collector's decoder as it was.

The completeness check walks every model of the schema in the written document: a field added to the schema and
not set here fails it, until the round trip says what becomes of it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from jaxmon.allocator import memory_numbers
from jaxmon.checkpoints import CheckpointReading
from jaxmon.device_readings import ArrayBytes, DeviceInfo, MemoryReading
from jaxmon.sources.spool_codec import (
    WorkloadReport,
    spool_checkpoint,
    spool_device,
    spool_training,
    training_reading,
    workload_report,
)
from jaxmon.sources.spool_document import SCHEMA, SpoolCompile, SpoolDocument
from jaxmon.training_readings import DeviceProfile, DeviceTraining, ProfileReading, TrainingReading

NOW = 1010.0

# Fields no reader turns into a number, each with why; every other field of every model must round-trip.
NOT_READ_BACK = {
    # Validated (the reader knows every version) and then done with: a report is the same whatever the version.
    ("SpoolDocument", "schema_"),
    # The publisher's period, kept for people reading the file; the reader ages files by their mtime (--ttl).
    ("SpoolDocument", "interval"),
}
# Fields the publisher does not write (so a document here leaves them unset): the sidecar reads the device's
# identity, and a TPU device's TensorCore count only matters to the publishing process's own peak FLOPs.
NOT_WRITTEN = {("SpoolDevice", "num_cores")}

STATS = {"bytes_in_use": 3 << 20, "bytes_limit": 16 << 30, "peak_bytes_in_use": 5 << 20, "num_allocs": 7}
DEVICES = [
    DeviceInfo(id=3, platform="tpu", device_kind="TPU v5 lite", process_index=1, coords="1,0,0", core_on_chip=0),
    DeviceInfo(id=4, platform="tpu", device_kind="TPU v5 lite", process_index=1, coords="1,1,0", core_on_chip=0),
    DeviceInfo(id=5, platform="tpu", device_kind="TPU v5 lite", process_index=1, coords="0,1,0", core_on_chip=0),
]
ARRAYS = ArrayBytes(
    live={("tpu", 3): 100, ("tpu", 4): 200},
    replicated={("tpu", 3): 40},
    host={(("tpu", 3), "pinned_host"): 8, (("tpu", 4), "unpinned_host"): 16},
)
READING = TrainingReading(
    steps_total=12,
    step=41,
    dispatched_step=42,
    last_step_timestamp=1009.5,
    duration_buckets=((0.5, 4), (1.0, 10), (float("inf"), 12)),
    duration_sum=9.25,
    examples_total=384.0,
    tokens_total=98304.0,
    host_wait_seconds_total=0.75,
    start_time_seconds=1000.0,
    productive_seconds_total=8.5,
    badput_seconds_total={"checkpoint": 0.5, "data": 0.25},
    devices=(
        DeviceTraining(
            platform="tpu",
            id=3,
            model_flops_total=1.5e15,
            hardware_flops_total=2.0e15,
            hardware_bytes_total=3.0e12,
            peak_flops=1.97e14,
            peak_source="table",
            mfu=0.375,
            hfu=0.5,
            collective_bytes_total={("all-reduce", "data", "ici"): 4096.0, ("all-gather", "data,model", "dcn"): 1024.0},
            program_peak_memory_bytes=6.0e9,
            link_bandwidth={"ici": 4.5e10, "dcn": 2.5e9},
        ),
    ),
    problems={"jump": 1, "unready": 2},
    loss={"acc": 0.75, "loss": 2.5},
    loss_step=40,
    profile=ProfileReading(
        results={"taken": 3, "busy": 1, "failed": 1, "skipped": 2},
        devices=(
            DeviceProfile(
                platform="tpu",
                id=3,
                profiled_seconds_total=0.5,
                parts={"compute": 0.25, "collective": 0.125, "copy": 0.0625, "idle": 0.0625},
                collectives={"all-reduce": 0.125},
                placed={("all-reduce", "data", "ici"): (0.125, 0.0625, 8192.0)},
                copies={"device_to_device": (0.03125, 4096.0), "host_to_device": (0.03125, 0.0)},
                sample_wait_ratio=0.25,
            ),
        ),
        sample_step=3000,
    ),
)


CHECKPOINT = CheckpointReading(step=40, time=1008.0, interval_seconds=1800.0, interval_steps=1000)


def written() -> SpoolDocument:
    """The document a publisher writes for DEVICES (stats on the first, live arrays only on the second, an error on
    the third), as a file carries it: dumped to JSON and validated again by the reader's model."""
    entries = [
        spool_device(DEVICES[0], {**STATS, "flag": True, "name": "x"}, None, ARRAYS),
        spool_device(DEVICES[1], None, None, ARRAYS),
        spool_device(DEVICES[2], None, "RuntimeError: gone"),
    ]
    doc = SpoolDocument(
        schema=SCHEMA,
        workload="trainer",
        host="node-a",
        pid=4242,
        process_index=1,
        jax_version="0.9.0",
        time=NOW,
        started=990.0,
        interval=5.0,
        devices=entries,
        compile=SpoolCompile(compilations=3, compile_seconds=1.5, cache_hits=2, cache_misses=1),
        training=spool_training(READING, NOW),
        process_count=4,
        scheduler={"namespace": "team-a", "pod": "trainer-0"},
        process_started=985.0,
        checkpoint=spool_checkpoint(CHECKPOINT),
    )
    return SpoolDocument.model_validate(json.loads(json.dumps(doc.model_dump(by_alias=True))))


def _fields(model: BaseModel, fields: dict[str, set[str]], given: dict[str, set[str]]) -> None:
    """Every field of `model`'s class and of every model in it (`fields`), and those set to other than their
    default somewhere in the document (`given`), by class name."""
    cls = type(model)
    fields.setdefault(cls.__name__, set()).update(cls.model_fields)
    for name, info in cls.model_fields.items():
        value = getattr(model, name)
        if info.is_required() or value != info.get_default(call_default_factory=True):
            given.setdefault(cls.__name__, set()).add(name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                _fields(item, fields, given)


def test_the_written_document_sets_every_field_of_schema_3() -> None:
    """A check on the round trip below: every field of every model of the schema is set, somewhere in the document
    it reads, to other than its default (a device has stats, or live arrays, or an error: each on one device)."""
    doc = written()
    fields: dict[str, set[str]] = {}
    given: dict[str, set[str]] = {}
    _fields(doc, fields, given)
    assert set(fields) == {
        "SpoolDocument",
        "SpoolDevice",
        "SpoolCompile",
        "SpoolTraining",
        "SpoolDeviceTraining",
        "SpoolCollectiveBytes",
        "SpoolPlacedCollective",
        "SpoolProfile",
        "SpoolDeviceProfile",
        "SpoolCheckpoint",
    }
    unset = {(cls, name) for cls, names in fields.items() for name in names - given.get(cls, set())}
    assert unset == NOT_WRITTEN
    assert doc.schema_ == SCHEMA


def test_every_field_of_a_document_reads_back_as_it_was_written() -> None:
    doc = written()
    report = workload_report(doc)
    assert (report.workload, report.host, report.pid, report.process_index, report.jax_version) == (
        "trainer",
        "node-a",
        4242,
        1,
        "0.9.0",
    )
    assert (report.time, report.started, report.process_count) == (NOW, 990.0, 4)
    assert report.compile == {"compilations": 3, "compile_seconds": 1.5, "cache_hits": 2, "cache_misses": 1}
    assert report.scheduler == {"namespace": "team-a", "pod": "trainer-0"}
    assert (report.process_started, report.checkpoint) == (985.0, CHECKPOINT)
    assert spool_checkpoint(CheckpointReading()) is None  # nothing to say: no section
    first, second, third = report.devices
    assert [d.info for d in report.devices] == DEVICES
    # The stats as numbers (what is no number is not written), and the allocator figures derived from them.
    assert doc.devices[0].memory_stats == STATS
    assert first.reading == MemoryReading(numbers=memory_numbers(STATS))
    assert (first.live_array_bytes, first.replicated_array_bytes) == (None, 40)
    assert first.host_array_bytes == {"pinned_host": 8, "unpinned_host": 0}
    # No stats: the live arrays are the device's memory figure; no arrays replicated on it is 0 bytes.
    assert second.reading == MemoryReading(numbers=memory_numbers(None))
    assert (second.live_array_bytes, second.replicated_array_bytes) == (200, 0)
    assert second.host_array_bytes == {"pinned_host": 0, "unpinned_host": 16}
    assert third.reading == MemoryReading(numbers=None, error="RuntimeError: gone")
    assert (third.live_array_bytes, third.replicated_array_bytes, third.host_array_bytes) == (None, None, None)
    # The training reading comes back as it was made.
    assert report.training == READING
    # Every field of the document is a field of the report, but those no reader turns into a number.
    read = {f.name for f in dataclasses.fields(WorkloadReport)}
    assert {("SpoolDocument", name) for name in set(SpoolDocument.model_fields) - read} == NOT_READ_BACK


def test_the_training_section_round_trips_on_its_own_and_without_steps() -> None:
    spooled = spool_training(READING, NOW)
    assert spooled.elapsed_seconds == 10.0 and spooled.duration_count == 12
    assert [(c.op, c.axes, c.bytes) for c in spooled.devices[0].collective_bytes_total] == [
        ("all-gather", "data,model", 1024.0),
        ("all-reduce", "data", 4096.0),
    ]
    assert training_reading(spooled, NOW) == READING
    empty = TrainingReading(start_time_seconds=NOW)
    assert training_reading(spool_training(empty, NOW), NOW) == empty


def test_an_array_pass_that_failed_is_each_arrays_only_devices_error() -> None:
    entry = spool_device(DEVICES[1], None, None, None, "RuntimeError: " + "x" * 5000)
    assert entry.error is not None and len(entry.error) == 4096 and entry.live_array_bytes is None
    assert (entry.replicated_array_bytes, entry.host_array_bytes) == (None, None)
    with_stats: dict[str, Any] = {"bytes_in_use": 1}
    assert spool_device(DEVICES[0], with_stats, None, None, "ignored").error is None


def test_a_diverged_loss_crosses_as_nan_and_inf_and_comes_back_as_read() -> None:
    """JSON has no NaN or inf: the document spells them as Prometheus does, and the reader turns them back into
    the floats the tracker read (a diverged loss is the news, never dropped)."""
    diverged = dataclasses.replace(
        READING, loss={"loss": float("nan"), "grad_norm": float("inf"), "margin": -float("inf"), "acc": 0.5}
    )
    text = json.dumps(spool_training(diverged, NOW).model_dump())
    assert json.loads(text)["loss"] == {"loss": "NaN", "grad_norm": "+Inf", "margin": "-Inf", "acc": 0.5}
    spooled = SpoolDocument.model_validate({**_doc(), "training": json.loads(text)}).training
    assert spooled is not None
    back = training_reading(spooled, NOW)
    assert math.isnan(back.loss["loss"])
    assert (back.loss["grad_norm"], back.loss["margin"], back.loss["acc"]) == (float("inf"), -float("inf"), 0.5)
    assert back.loss_step == 40


def test_a_schema_3_document_of_a_publisher_before_the_loss_reads_as_no_loss() -> None:
    training = spool_training(READING, NOW).model_dump()
    del training["loss"], training["loss_step"]
    back = workload_report(SpoolDocument.model_validate({**_doc(), "training": training})).training
    assert back is not None
    assert (back.loss, back.loss_step) == ({}, None)
    assert back == dataclasses.replace(READING, loss={}, loss_step=None)


@pytest.mark.parametrize(
    ("loss", "where"),
    [
        ({f"n{i:02d}": 1.0 for i in range(17)}, "training.loss"),  # more names than a writer exports
        ({"": 1.0}, "training.loss."),  # an empty name
        ({"x" * 65: 1.0}, "training.loss."),  # a name longer than a writer cuts it to
        ({"loss": "nan"}, "training.loss.loss"),  # not how a writer spells NaN
        ({"loss": None}, "training.loss.loss"),
    ],
)
def test_a_forged_loss_is_rejected_naming_the_field(loss: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as exc:
        SpoolDocument.model_validate({**_doc(), "training": {"loss": loss}})
    first = exc.value.errors()[0]
    assert ".".join(str(p) for p in first["loc"]).startswith(where)


def _doc() -> dict[str, Any]:
    """The written document as JSON data, its training section to be replaced."""
    data: dict[str, Any] = json.loads(json.dumps(written().model_dump(by_alias=True)))
    return data
