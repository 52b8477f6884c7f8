"""Protobuf's wire format, as much of it as an XSpace uses: varints, length-delimited payloads, fixed 64-bit
doubles, and tsl's XStat (metadata_id=1; double_value=2 | uint64_value=3 | int64_value=4 | str_value=5 |
bytes_value=6 | ref_value=7). Shared by `jaxmon.xla.xspace`; every error is an XSpaceError naming the byte."""

from __future__ import annotations

import struct
from collections.abc import Iterator

__all__ = ["StatValue", "XSpaceError"]

StatValue = int | float | str | bytes

_DOUBLE = struct.Struct("<d")
SIGN = 1 << 63
WRAP = 1 << 64


class XSpaceError(ValueError):
    """The bytes are not a serialized XSpace this reader understands; the message says where and what."""


def varint(buf: bytes, pos: int) -> tuple[int, int]:
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


def signed(v: int) -> int:
    return v - WRAP if v >= SIGN else v


def fields(buf: bytes, pos: int, end: int, what: str) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value, next) for each field of the message in buf[pos:end]: for a length-delimited
    field the value is the payload's start and `next` its end; for the others `next` is where the next field starts."""
    while pos < end:
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 2:
            size, start = varint(buf, pos)
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


def text(buf: bytes, start: int, end: int, what: str) -> str:
    try:
        return buf[start:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise XSpaceError(f"{what} is not UTF-8 at byte {start}: {e}") from None


def stat(buf: bytes, pos: int, end: int, refs: dict[int, str]) -> tuple[int, StatValue]:
    """One XStat: (metadata id, value)."""
    mid = 0
    value: StatValue = 0
    for number, wire, v, n in fields(buf, pos, end, "XStat"):
        if number == 1 and wire == 0:
            mid = v
        elif number == 2 and wire == 1:
            value = _DOUBLE.unpack_from(buf, v)[0]
        elif number == 3 and wire == 0:
            value = v
        elif number == 4 and wire == 0:
            value = signed(v)
        elif number == 5 and wire == 2:
            value = text(buf, v, n, "XStat.str_value")
        elif number == 6 and wire == 2:
            value = buf[v:n]
        elif number == 7 and wire == 0:
            value = refs.get(v, "")
    return mid, value


def stat_value(buf: bytes, pos: int, end: int, refs: dict[int, str]) -> StatValue:
    """The value of an XStat whose metadata_id has been read, from `pos`; the common one-field case inline."""
    if pos == end:
        return 0  # a zero the writer left out
    tag = buf[pos]
    if tag == 0x2A or tag == 0x32:  # str_value, bytes_value
        size = buf[pos + 1] if pos + 1 < end else 0x80
        start = pos + 2
        if size >= 0x80:
            size, start = varint(buf, pos + 1)
        if start + size == end:
            raw = buf[start:end]
            if tag == 0x32:
                return raw
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise XSpaceError(f"XStat.str_value is not UTF-8 at byte {start}: {e}") from None
    elif tag == 0x38 or tag == 0x18 or tag == 0x20:  # ref_value, uint64_value, int64_value
        v, stop = varint(buf, pos + 1)
        if stop == end:
            return refs.get(v, "") if tag == 0x38 else signed(v) if tag == 0x20 else v
    elif tag == 0x11 and pos + 9 == end:  # double_value
        return float(_DOUBLE.unpack_from(buf, pos + 1)[0])
    return stat(buf, pos, end, refs)[1]  # anything else: field by field


def skip(buf: bytes, pos: int, key: int, end: int) -> int:
    wire = key & 7
    if wire == 0:
        return varint(buf, pos)[1]
    if wire == 2:
        size, pos = varint(buf, pos)
        return pos + size
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    raise XSpaceError(f"field {key >> 3} has wire type {wire} at byte {pos}, which XSpace never uses")
