"""The XSpace reader, and the fakes it is tested on: jaxlib's own parser reads the fakes back as written."""

from __future__ import annotations

from typing import Any

import jax
import pytest

from jaxmon.xla.xspace import XSpaceError, parse
from tests.xspace_fakes import FakeSpace, Kernel, Ref, TpuOp, Uint, gpu_space, tpu_space, varint

KERNELS = [
    Kernel(7, "loop_add_fusion", 0, 30, hlo_op="fusion.1"),
    Kernel(13, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 50, hlo_op="all-reduce-start.1"),
    Kernel(14, "MemcpyD2H", 55, 75, memcpy="kind_src:device kind_dst:pinned num_bytes:4096"),
]


def _profile_data(data: bytes) -> dict[str, dict[str, list[tuple[str, float, float, dict[str, Any]]]]]:
    pd = jax.profiler.ProfileData.from_serialized_xspace(data)
    return {
        p.name: {
            line.name: [(e.name, e.start_ns, e.duration_ns, dict(e.stats)) for e in line.events] for line in p.lines
        }
        for p in pd.planes
    }


def _ours(data: bytes) -> dict[str, dict[str, list[tuple[str, float, float, dict[str, Any]]]]]:
    space = parse(data)
    return {
        p.name: {
            line.name: [
                (
                    p.event_names[e.metadata_id],
                    e.start_ps / 1000,
                    e.duration_ps / 1000,
                    {p.stat_names[k]: v for k, v in e.stats.items()},
                )
                for e in line.events()
            ]
            for line in p.lines
        }
        for p in space.planes
    }


@pytest.mark.parametrize(
    "data",
    [
        gpu_space({0: KERNELS, 1: KERNELS[:2]}),
        tpu_space({0: [TpuOp("while.1", 20, 60, "while"), TpuOp("all-reduce.3", 40, 55, "all-reduce")]}),
    ],
    ids=["gpu", "tpu"],
)
def test_jaxlib_reads_the_fakes_as_this_reader_does(data: bytes) -> None:
    theirs = _profile_data(data)
    assert theirs == _ours(data)
    assert any(name.startswith("/device:") for name in theirs)


def test_jaxlib_reads_every_stat_type_the_fakes_write() -> None:
    space = FakeSpace()
    plane = space.plane("/device:GPU:3", id=4)
    plane.line("Stream #9(Kernel)", id=9, timestamp_ns=2_000).event(
        "k", 1.5, 4.25, {"i": -7, "u": Uint(1 << 63), "d": 2.5, "s": "text", "r": Ref("interned"), "b": b"\x00\x01"}
    )
    data = space.encode()
    [(name, start, duration, stats)] = _profile_data(data)["/device:GPU:3"]["Stream #9(Kernel)"]
    assert (name, start, duration) == ("k", 1500.0, 2750.0)
    assert stats["i"] == -7 and stats["u"] == 1 << 63 and stats["d"] == 2.5 and stats["s"] == "text"
    assert stats["r"] == "interned"
    assert _ours(data)["/device:GPU:3"]["Stream #9(Kernel)"][0][3] == {
        "i": -7,
        "u": 1 << 63,
        "d": 2.5,
        "s": "text",
        "r": "interned",
        "b": b"\x00\x01",
    }


def test_metadata_stats_and_plane_stats() -> None:
    space = parse(tpu_space({2: [TpuOp("all-gather-start.5", 0, 10, "all-gather", asynchronous=True)]}))
    tpu = space.plane("/device:TPU:2")
    assert tpu is not None
    [meta] = [m for i, m in tpu.event_stats.items() if tpu.event_names[i] == "all-gather-start.5"]
    assert meta["hlo_category"] == "all-gather"
    assert tpu.stats["peak_teraflops_per_second"] == 918.0
    env = space.plane("Task Environment")
    assert env is not None and env.stats["profile_stop_time"] - env.stats["profile_start_time"] == 100_000  # type: ignore[operator]
    assert space.hostnames == ["fakehost"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x05\x12\x03ab", "run past"),  # a plane of 5 bytes whose name claims 3 and has 2
        (b"\x0a", "truncated varint"),
        (b"\x0b", "wire type 3"),  # a group start: never in an XSpace
        (b"\x0a\x03\x12\x01\xff", "not UTF-8"),
        (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_bad_bytes_raise_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(XSpaceError, match=message):
        space = parse(data)
        for plane in space.planes:
            for line in plane.lines:
                line.events()


def test_an_event_that_runs_past_its_end_is_an_error() -> None:
    # An XLine holding one event whose duration varint claims more bytes than the event has.
    event = b"\x08\x01\x18\xff"
    line = b"\x22" + varint(len(event)) + event
    plane = b"\x1a" + varint(len(line)) + line
    space = parse(b"\x0a" + varint(len(plane)) + plane)
    with pytest.raises(XSpaceError):
        space.planes[0].lines[0].events()


def test_an_empty_space_has_no_planes() -> None:
    assert parse(b"").planes == []


def test_the_slow_paths_of_stat_decoding_read_the_same_values() -> None:
    """Stat ids past 127 (two-byte varints), long strings, and a stat whose value precedes its metadata_id each
    leave the reader's inline path for the field-by-field one."""
    space = FakeSpace()
    plane = space.plane("/device:GPU:0")
    for i in range(130):
        plane.stat_id(f"filler_{i}")
    line = plane.line("Stream #1")
    long_text = "x" * 300
    line.event("k", 0, 1, {"hlo_op": "all-reduce.1", "long": long_text, "neg": -1, "ref": Ref("fusion.2")})
    data = space.encode()
    # The same event again, its one stat written value first: str_value (field 5) before metadata_id (field 1).
    sid = plane.stat_id("hlo_op")
    stat = b"\x2a\x04abcd" + b"\x08" + varint(sid)
    event = b"\x08\x01\x22" + varint(len(stat)) + stat
    line_bytes = b"\x12\x09Stream #2" + b"\x22" + varint(len(event)) + event
    parsed = parse(data)
    [gpu] = parsed.planes
    [e] = gpu.lines[0].events()
    assert {gpu.stat_names[k]: v for k, v in e.stats.items()} == {
        "hlo_op": "all-reduce.1",
        "long": long_text,
        "neg": -1,
        "ref": "fusion.2",
    }
    [only] = gpu.lines[0].events(wanted={sid})
    assert only.stats == {sid: "all-reduce.1"}
    # A plane with the same stat metadata holding just the hand-written line (fields in any order are read).
    other = space.plane("/device:GPU:1")
    other.stat_ids = dict(plane.stat_ids)
    body = other.encode() + b"\x1a" + varint(len(line_bytes)) + line_bytes
    reparsed = parse(b"\x0a" + varint(len(body)) + body)
    [hand] = reparsed.planes[0].lines[0].events()
    assert hand.stats == {sid: "abcd"}


def test_a_trace_without_its_task_environment_spans_its_device_events() -> None:
    from jaxmon.xla.profile import read

    space = FakeSpace()
    space.plane("/device:TPU:0").line("XLA Ops").event("fusion.1", 10, 25.5)
    trace = read(space.encode())
    assert trace.start_unix_ns is None
    assert trace.extent_ns() == (10_000, 25_500)
    assert trace.split()[("tpu", 0)].compute == 15_500_000
    with pytest.raises(ValueError, match="profile_start_time"):
        trace.trace_ns(0)
    with pytest.raises(ValueError, match="before it starts"):
        trace.split(10, 5)
