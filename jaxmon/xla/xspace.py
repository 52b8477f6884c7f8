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

Cost and the GIL: pure Python never holds the GIL for long in one stretch (the interpreter takes it away at its
switch interval, 5 ms, and this reader hands it over every 1024 events), where jaxlib's C++ parser
(`jax.profiler.ProfileData.from_serialized_xspace`) holds it for the whole parse: 232 ms on a 16 MB GPU trace
(bench/profile_parse.py; BENCHMARKS.md, "Sampled traces"). What a caller does not read is never decoded: `parse()`
reads each plane's and each line's header and the plane's metadata; events are decoded when `Line.events()` or
`iter_events()` is called, line by line, with only the stats asked for, and a plane's lines can be skipped unread.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from jaxmon.xla.wire import SIGN, WRAP, StatValue, XSpaceError, fields, signed, skip, stat, stat_value, text, varint

__all__ = ["Event", "Line", "Plane", "StatValue", "XSpace", "XSpaceError", "parse"]

# Every 1024 events the reader sleeps 0 s, which releases the GIL: a thread waiting for it (the trainer's) runs then,
# not after the interpreter's switch interval (5 ms).
YIELD_MASK = 1023


class Event(NamedTuple):
    """One XEvent: its metadata id (its name is `Plane.event_names[metadata_id]`), absolute start and duration in
    picoseconds, and its own stats by stat metadata id (ref values resolved to their strings)."""

    metadata_id: int
    start_ps: int
    duration_ps: int
    stats: dict[int, StatValue]


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

    def events(self, wanted: Container[int] | None = None) -> list[Event]:
        """The line's events, with the stats whose metadata id is in `wanted` (all of them by default): a reader
        that needs two stats of a kernel's ten skips the rest undecoded."""
        return list(self.iter_events(wanted))

    def iter_events(self, wanted: Container[int] | None = None) -> Iterator[Event]:
        """`events()` one at a time: a reader that keeps only what it derives lets each event die young, which
        spares the process the full garbage collections (GIL held throughout) that a line's list of 100k events
        kept alive would bring on."""
        try:
            yield from self._events(wanted)
        except IndexError:
            raise XSpaceError(f"an event of line {self.name!r} runs past the end of the data") from None

    def _events(self, wanted: Container[int] | None) -> Iterator[Event]:
        buf, refs = self._buf, self._refs
        base = self.timestamp_ns * 1000
        for i, (start, end) in enumerate(self._spans):
            if not i & YIELD_MASK:
                time.sleep(0)  # hand the GIL to a waiting thread now rather than at the next forced switch
            mid = offset = duration = 0
            stats: dict[int, StatValue] = {}
            pos = start
            # The hot loop: XEvent's fields decoded inline, single-byte varints without a call.
            while pos < end:
                key = buf[pos]
                if key >= 0x80:
                    key, pos = varint(buf, pos)
                else:
                    pos += 1
                if key == 0x22:  # a stat
                    size = buf[pos] if pos < end else 0x80
                    if size < 0x80:
                        pos += 1
                    else:
                        size, pos = varint(buf, pos)
                    stop = pos + size
                    if stop > end:
                        raise XSpaceError(f"XEvent stat at byte {pos} runs past its event's end")
                    if size >= 2 and buf[pos] == 0x08 and buf[pos + 1] < 0x80:  # metadata_id first, as written
                        sid = buf[pos + 1]
                        if wanted is None or sid in wanted:
                            stats[sid] = stat_value(buf, pos + 2, stop, refs)
                    else:
                        sid, value = stat(buf, pos, stop, refs)
                        if wanted is None or sid in wanted:
                            stats[sid] = value
                    pos = stop
                elif key == 0x08 or key == 0x10 or key == 0x18 or key == 0x28:  # metadata_id, offset, duration, occ.
                    v = shift = 0
                    while True:  # a varint, inline (an IndexError past the buffer's end is caught below)
                        b = buf[pos]
                        pos += 1
                        v |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift > 63:
                            raise XSpaceError(f"varint longer than 10 bytes ending at byte {pos}")
                    if v >= SIGN:
                        v -= WRAP
                    if key == 0x08:
                        mid = v
                    elif key == 0x10:
                        offset = v
                    elif key == 0x18:
                        duration = v
                else:
                    pos = skip(buf, pos, key, end)
            if pos != end:
                raise XSpaceError(f"XEvent at byte {start} runs past its end")
            yield Event(mid, base + offset, duration, stats)


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
    for number, wire, v, n in fields(buf, pos, end, "map entry"):
        if number == 1 and wire == 0:
            key = signed(v)
        elif number == 2 and wire == 2:
            vstart, vend = v, n
    return key, vstart, vend


def _plane(buf: bytes, pos: int, end: int) -> Plane:
    pid, name = 0, ""
    line_spans: list[tuple[int, int]] = []
    event_meta: list[tuple[int, int, int]] = []
    stat_meta: list[tuple[int, int, int]] = []
    stat_spans: list[tuple[int, int]] = []
    for number, wire, v, n in fields(buf, pos, end, "XPlane"):
        if wire == 2:
            span = (v, n)
            if number == 2:
                name = text(buf, v, n, "XPlane.name")
            elif number == 3:
                line_spans.append(span)
            elif number == 4:
                event_meta.append(_map_entry(buf, *span))
            elif number == 5:
                stat_meta.append(_map_entry(buf, *span))
            elif number == 6:
                stat_spans.append(span)
        elif number == 1 and wire == 0:
            pid = signed(v)
    # Stat names first: stats everywhere else refer to them (protobuf writes fields in number order, lines first).
    stat_names: dict[int, str] = {}
    for key, s, e in stat_meta:
        for number, wire, v, n in fields(buf, s, e, "XStatMetadata"):
            if number == 2 and wire == 2:
                stat_names[key] = text(buf, v, n, "XStatMetadata.name")
    event_names: dict[int, str] = {}
    event_stats: dict[int, dict[str, StatValue]] = {}
    for key, s, e in event_meta:
        ename, estats = "", {}
        for number, wire, v, n in fields(buf, s, e, "XEventMetadata"):
            if number == 2 and wire == 2:
                ename = text(buf, v, n, "XEventMetadata.name")
            elif number == 5 and wire == 2:
                sid, value = stat(buf, v, n, stat_names)
                estats[stat_names.get(sid, str(sid))] = value
        event_names[key] = ename
        if estats:
            event_stats[key] = estats
    stats = {}
    for s, e in stat_spans:
        sid, value = stat(buf, s, e, stat_names)
        stats[stat_names.get(sid, str(sid))] = value
    return Plane(pid, name, [_line(buf, s, e, stat_names) for s, e in line_spans], event_names, event_stats,
                 stat_names, stats)  # fmt: skip


def _line(buf: bytes, pos: int, end: int, refs: dict[int, str]) -> Line:
    lid, name, display, ts, dur = 0, "", "", 0, 0
    spans: list[tuple[int, int]] = []
    append = spans.append
    while pos < end:
        if not len(spans) & YIELD_MASK:
            time.sleep(0)
        if buf[pos] == 0x22:  # an event: most of a line, walked without decoding it
            size = buf[pos + 1] if pos + 1 < end else 0x80
            start = pos + 2
            if size >= 0x80:
                size, start = varint(buf, pos + 1)
            pos = start + size
            if pos > end:
                raise XSpaceError(f"XLine event at byte {start} runs past its line's end")
            append((start, pos))
            continue
        for number, wire, v, n in fields(buf, pos, _field_end(buf, pos, end), "XLine"):
            if wire == 2:
                if number == 4:
                    append((v, n))
                elif number == 2:
                    name = text(buf, v, n, "XLine.name")
                elif number == 11:
                    display = text(buf, v, n, "XLine.display_name")
            elif wire == 0:
                if number == 1:
                    lid = signed(v)
                elif number == 3:
                    ts = signed(v)
                elif number == 9:
                    dur = signed(v)
            pos = n
    return Line(lid, name, display, ts, dur, buf, spans, refs)


def _field_end(buf: bytes, pos: int, end: int) -> int:
    """Where the field starting at `pos` ends."""
    key, p = varint(buf, pos)
    stop = skip(buf, p, key, end)
    if stop > end:
        raise XSpaceError(f"XLine field {key >> 3} at byte {pos} runs past its line's end")
    return stop


def parse(data: bytes) -> XSpace:
    """The planes, hostnames, errors and warnings of a serialized XSpace; events stay undecoded until read."""
    buf = bytes(data)
    planes: list[Plane] = []
    texts: dict[int, list[str]] = {2: [], 3: [], 4: []}
    for number, wire, v, n in fields(buf, 0, len(buf), "XSpace"):
        if wire != 2:
            continue
        if number == 1:
            planes.append(_plane(buf, v, n))
        elif number in texts:
            texts[number].append(text(buf, v, n, "XSpace string"))
    return XSpace(planes, texts[4], texts[2], texts[3])
