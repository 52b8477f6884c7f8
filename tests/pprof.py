"""A minimal reader of pprof profiles (github.com/google/pprof proto/profile.proto): samples and their labels."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field

# Wire types of the protobuf encoding (protobuf.dev/programming-guides/encoding).
VARINT, I64, LEN, I32 = 0, 1, 2, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """Every (field number, wire type, value) of one message, in order; LEN values as raw bytes."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == VARINT:
            value, pos = _varint(data, pos)
        elif wire == LEN:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == I64:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == I32:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"wire type {wire} at byte {pos} is not protobuf")
        out.append((number, wire, value))
    return out


def _ints(wire: int, value: int | bytes) -> list[int]:
    """A repeated int64 field's values: packed (LEN) or one varint; two's complement for negatives."""
    if isinstance(value, int):
        raw = [value]
    else:
        raw, pos = [], 0
        while pos < len(value):
            v, pos = _varint(value, pos)
            raw.append(v)
    return [v - (1 << 64) if v >= 1 << 63 else v for v in raw]


@dataclass
class Sample:
    """One pprof sample: its values (one per sample type) and labels (string or number)."""

    values: list[int] = field(default_factory=list)
    labels: dict[str, str | int] = field(default_factory=dict)


@dataclass
class Profile:
    """The parts of a pprof profile the tests read."""

    sample_types: list[tuple[str, str]]
    samples: list[Sample]

    def value(self, sample: Sample, type_name: str) -> int:
        """`sample`'s value of the sample type `type_name` (e.g. "space")."""
        index = [t for t, _ in self.sample_types].index(type_name)
        return sample.values[index]


def parse_profile(data: bytes) -> Profile:
    """Parse a pprof profile, gunzipping it first when it is gzipped."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    strings: list[str] = []
    raw_types: list[bytes] = []
    raw_samples: list[bytes] = []
    for number, _, value in fields(data):
        if number == 6 and isinstance(value, bytes):  # string_table
            strings.append(value.decode())
        elif number == 1 and isinstance(value, bytes):  # sample_type: ValueType
            raw_types.append(value)
        elif number == 2 and isinstance(value, bytes):  # sample
            raw_samples.append(value)
    sample_types = []
    for raw in raw_types:
        t = {n: v for n, _, v in fields(raw)}
        sample_types.append((strings[int(t.get(1, 0))], strings[int(t.get(2, 0))]))
    samples = []
    for raw in raw_samples:
        s = Sample()
        for number, wire, value in fields(raw):
            if number == 2:  # value: repeated int64
                s.values.extend(_ints(wire, value))
            elif number == 3 and isinstance(value, bytes):  # label: key, str, num
                label = {n: v for n, _, v in fields(value)}
                key = strings[int(label.get(1, 0))]
                s.labels[key] = strings[int(label[2])] if label.get(2) else _ints(VARINT, label.get(3, 0))[0]
        samples.append(s)
    return Profile(sample_types, samples)
