"""A reader of serialized XSpace profiles (`.xplane.pb`), the protobuf `jax.profiler.stop_trace()` writes, in pure
Python with no dependency: a trainer's `pip install jaxmon` brings neither `protobuf` nor permission to call into
JAX outside `jaxmon.sources.local`.

The schema is tsl's `xla/tsl/profiler/protobuf/xplane.proto` (package `tensorflow.profiler`); the field numbers are
the facts this module is written against:

    XSpace         planes=1 (XPlane), errors=2, warnings=3, hostnames=4
    XPlane         id=1, name=2, lines=3 (XLine), event_metadata=4 (map<int64, XEventMetadata>),
                   stat_metadata=5 (map<int64, XStatMetadata>), stats=6 (XStat)
    XLine          id=1, display_id=10, name=2, display_name=11, timestamp_ns=3, duration_ps=9, events=4 (XEvent)
    XEvent         metadata_id=1, offset_ps=2 | num_occurrences=5 (oneof), duration_ps=3, stats=4 (XStat)
    XStat          metadata_id=1, double_value=2 | uint64_value=3 | int64_value=4 | str_value=5 | bytes_value=6 |
                   ref_value=7 (oneof; a ref names the XStatMetadata whose `name` is the string)
    XEventMetadata id=1, name=2, display_name=4, metadata=3, stats=5 (XStat), child_id=6
    XStatMetadata  id=1, name=2, description=3
    map entries    key=1, value=2

An event starts at its line's `timestamp_ns` (ns) plus its `offset_ps`; this module gives times in picoseconds as
ints (`start_ps`, `duration_ps`), so sums over a trace are exact. Unknown fields are skipped, as protobuf does.

Cost and the GIL: pure Python releases the GIL at the interpreter's switch interval (5 ms by default), so a training
thread waiting for it waits at most that long, however large the trace; the work is split so that what a caller
does not read is never decoded. `parse()` reads each plane's and each line's header and the plane's metadata;
events are decoded when `Line.events()` is called, line by line, and a plane's lines can be skipped unread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Event", "Line", "Plane", "StatValue", "XSpace", "XSpaceError", "parse"]

StatValue = int | float | str | bytes

_DOUBLE = struct.Struct("<d")
_SIGN = 1 << 63
_WRAP = 1 << 64


class XSpaceError(ValueError):
    """The bytes are not a serialized XSpace this reader understands; the message says where and what."""


class Event(NamedTuple):
    """One XEvent: its metadata id (its name is `Plane.event_names[metadata_id]`), absolute start and duration in
    picoseconds, and its own stats by stat metadata id (ref values resolved to their strings)."""

    metadata_id: int
    start_ps: int
    duration_ps: int
    stats: dict[int, StatValue]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise XSpaceError(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise XSpaceError(f"varint longer than 10 bytes ending at byte {pos}")


def _signed(v: int) -> int:
    return v - _WRAP if v >= _SIGN else v


def _fields(buf: bytes, pos: int, end: int, what: str) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value, next) for each field of the message in buf[pos:end]: for a length-delimited
    field the value is the payload's start and `next` its end; for the others `next` is where the next field starts."""
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, start = _varint(buf, pos)
            pos = start + size
            if pos > end:
                raise XSpaceError(f"{what} field {number}: {size} bytes at byte {start} run past its message's end")
            value = start
        elif wire == 1:
            value, pos = pos, pos + 8
        elif wire == 5:
            value, pos = pos, pos + 4
        else:
            raise XSpaceError(f"{what} field {number} has wire type {wire} at byte {pos}, which XSpace never uses")
        if pos > end:
            raise XSpaceError(f"{what} field {number} runs past its message's end at byte {end}")
        yield number, wire, value, pos


def _text(buf: bytes, start: int, end: int, what: str) -> str:
    try:
        return buf[start:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise XSpaceError(f"{what} is not UTF-8 at byte {start}: {e}") from None


def _stat(buf: bytes, pos: int, end: int, refs: dict[int, str]) -> tuple[int, StatValue]:
    """One XStat: (metadata id, value)."""
    mid = 0
    value: StatValue = 0
    for number, wire, v, n in _fields(buf, pos, end, "XStat"):
        if number == 1 and wire == 0:
            mid = v
        elif number == 2 and wire == 1:
            value = _DOUBLE.unpack_from(buf, v)[0]
        elif number == 3 and wire == 0:
            value = v
        elif number == 4 and wire == 0:
            value = _signed(v)
        elif number == 5 and wire == 2:
            value = _text(buf, v, n, "XStat.str_value")
        elif number == 6 and wire == 2:
            value = buf[v:n]
        elif number == 7 and wire == 0:
            value = refs.get(v, "")
    return mid, value


@dataclass
class Line:
    """One XLine's header; `events()` decodes its events (each call decodes them again)."""

    id: int
    name: str
    display_name: str
    timestamp_ns: int
    duration_ps: int
    _buf: bytes = field(repr=False)
    _spans: list[tuple[int, int]] = field(repr=False)  # each event's payload
    _refs: dict[int, str] = field(repr=False)

    def __len__(self) -> int:
        return len(self._spans)

    def events(self) -> list[Event]:
        buf, refs = self._buf, self._refs
        base = self.timestamp_ns * 1000
        out: list[Event] = []
        append = out.append
        for start, end in self._spans:
            mid = offset = duration = 0
            stats: dict[int, StatValue] = {}
            pos = start
            # The hot loop: XEvent's fields decoded inline (one varint call each) rather than through _fields.
            while pos < end:
                key = buf[pos]
                if key >= 0x80:
                    key, pos = _varint(buf, pos)
                else:
                    pos += 1
                if key == 0x08 or key == 0x10 or key == 0x18 or key == 0x28:  # metadata_id, offset, duration, occ.
                    v = buf[pos] if pos < end else 0x80
                    if v < 0x80:
                        pos += 1
                    else:
                        v, pos = _varint(buf, pos)
                    if key == 0x08:
                        mid = v
                    elif key == 0x10:
                        offset = _signed(v)
                    elif key == 0x18:
                        duration = _signed(v)
                elif key == 0x22:  # stats
                    size, pos = _varint(buf, pos)
                    if pos + size > end:
                        raise XSpaceError(f"XEvent stat at byte {pos} runs past its event's end")
                    sid, value = _stat(buf, pos, pos + size, refs)
                    stats[sid] = value
                    pos += size
                else:
                    pos = _skip(buf, pos, key, end)
            if pos != end:
                raise XSpaceError(f"XEvent at byte {start} runs past its end")
            append(Event(mid, base + offset, duration, stats))
        return out


def _skip(buf: bytes, pos: int, key: int, end: int) -> int:
    wire = key & 7
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 2:
        size, pos = _varint(buf, pos)
        return pos + size
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    raise XSpaceError(f"XEvent field {key >> 3} has wire type {wire} at byte {pos}, which XSpace never uses")


@dataclass
class Plane:
    """One XPlane: its lines (events not yet decoded), event names and metadata stats by event metadata id, stat
    names by stat metadata id, and its own stats by stat name."""

    id: int
    name: str
    lines: list[Line]
    event_names: dict[int, str]
    event_stats: dict[int, dict[str, StatValue]]
    stat_names: dict[int, str]
    stats: dict[str, StatValue]


@dataclass
class XSpace:
    planes: list[Plane]
    hostnames: list[str]
    errors: list[str]
    warnings: list[str]

    def plane(self, name: str) -> Plane | None:
        return next((p for p in self.planes if p.name == name), None)


def _map_entry(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """A map<int64, Message> entry: (key, value start, value end); an absent value is an empty message."""
    key, vstart, vend = 0, end, end
    for number, wire, v, n in _fields(buf, pos, end, "map entry"):
        if number == 1 and wire == 0:
            key = _signed(v)
        elif number == 2 and wire == 2:
            vstart, vend = v, n
    return key, vstart, vend


def _plane(buf: bytes, pos: int, end: int) -> Plane:
    pid, name = 0, ""
    line_spans: list[tuple[int, int]] = []
    event_meta: list[tuple[int, int, int]] = []
    stat_meta: list[tuple[int, int, int]] = []
    stat_spans: list[tuple[int, int]] = []
    for number, wire, v, n in _fields(buf, pos, end, "XPlane"):
        if wire == 2:
            span = (v, n)
            if number == 2:
                name = _text(buf, v, n, "XPlane.name")
            elif number == 3:
                line_spans.append(span)
            elif number == 4:
                event_meta.append(_map_entry(buf, *span))
            elif number == 5:
                stat_meta.append(_map_entry(buf, *span))
            elif number == 6:
                stat_spans.append(span)
        elif number == 1 and wire == 0:
            pid = _signed(v)
    # Stat names first: stats everywhere else refer to them (protobuf writes fields in number order, lines first).
    stat_names: dict[int, str] = {}
    for key, s, e in stat_meta:
        for number, wire, v, n in _fields(buf, s, e, "XStatMetadata"):
            if number == 2 and wire == 2:
                stat_names[key] = _text(buf, v, n, "XStatMetadata.name")
    event_names: dict[int, str] = {}
    event_stats: dict[int, dict[str, StatValue]] = {}
    for key, s, e in event_meta:
        ename, estats = "", {}
        for number, wire, v, n in _fields(buf, s, e, "XEventMetadata"):
            if number == 2 and wire == 2:
                ename = _text(buf, v, n, "XEventMetadata.name")
            elif number == 5 and wire == 2:
                sid, value = _stat(buf, v, n, stat_names)
                estats[stat_names.get(sid, str(sid))] = value
        event_names[key] = ename
        if estats:
            event_stats[key] = estats
    stats = {}
    for s, e in stat_spans:
        sid, value = _stat(buf, s, e, stat_names)
        stats[stat_names.get(sid, str(sid))] = value
    return Plane(pid, name, [_line(buf, s, e, stat_names) for s, e in line_spans], event_names, event_stats,
                 stat_names, stats)  # fmt: skip


def _line(buf: bytes, pos: int, end: int, refs: dict[int, str]) -> Line:
    lid, name, display, ts, dur = 0, "", "", 0, 0
    spans: list[tuple[int, int]] = []
    for number, wire, v, n in _fields(buf, pos, end, "XLine"):
        if wire == 2:
            if number == 4:
                spans.append((v, n))
            elif number == 2:
                name = _text(buf, v, n, "XLine.name")
            elif number == 11:
                display = _text(buf, v, n, "XLine.display_name")
        elif wire == 0:
            if number == 1:
                lid = _signed(v)
            elif number == 3:
                ts = _signed(v)
            elif number == 9:
                dur = _signed(v)
    return Line(lid, name, display, ts, dur, buf, spans, refs)


def parse(data: bytes) -> XSpace:
    """The planes, hostnames, errors and warnings of a serialized XSpace; events stay undecoded until read."""
    buf = bytes(data)
    planes: list[Plane] = []
    texts: dict[int, list[str]] = {2: [], 3: [], 4: []}
    for number, wire, v, n in _fields(buf, 0, len(buf), "XSpace"):
        if wire != 2:
            continue
        if number == 1:
            planes.append(_plane(buf, v, n))
        elif number in texts:
            texts[number].append(_text(buf, v, n, "XSpace string"))
    return XSpace(planes, texts[4], texts[2], texts[3])
