"""Fakes at the profiler boundary: `.xplane.pb` bytes with the GPU and TPU layouts, written as the real protobuf.

No GPU or TPU here, so the tests build the XSpace such a machine's `jax.profiler.stop_trace()` writes: tsl's
`xplane.proto` (package tensorflow.profiler) encoded by hand, with its field numbers (listed in
`jaxmon/xla/xspace.py`; tests/unit/xla/test_xspace_fakes.py checks that jaxlib's own parser,
`jax.profiler.ProfileData.from_serialized_xspace`, reads back every plane, line, event and stat written here).

The layouts follow XLA's CUPTI collector (GPU stream lines `Stream #<id>(<kinds>)`, NCCL and XLA kernels with
`hlo_op`/`hlo_module` stats, `MemcpyH2D`-style copies with `memcpy_details`) and XProf's TPU planes (`XLA Modules`,
`XLA Ops` with ops nested in loops, `Async XLA Ops`, `XLA TraceMe`; `hlo_category` on the op's metadata), plus the
lines that must be ignored (derived `XLA Ops`/`XLA Modules`/`Steps` lines on a GPU, a host plane whose launch events
carry `hlo_op` and `device_ordinal`). Times are laid out in microseconds of the trace's clock.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

StatInput = int | float | str | bytes


class Ref(str):
    """A string stat written as `ref_value`: the id of the XStatMetadata whose name is the string."""


class Uint(int):
    """An integer stat written as `uint64_value` (plain ints are `int64_value`)."""


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def _int(number: int, value: int) -> bytes:
    return _key(number, 0) + varint(value) if value else b""  # proto3 leaves zeros out


def _delimited(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + varint(len(payload)) + payload


def _str(number: int, text: str) -> bytes:
    return _delimited(number, text.encode()) if text else b""


@dataclass
class FakeLine:
    plane: FakePlane
    id: int
    name: str
    timestamp_ns: int = 0
    display_name: str = ""
    events: list[tuple[int, int, int, dict[str, StatInput]]] = field(default_factory=list)

    def event(
        self,
        name: str,
        start_us: float,
        end_us: float,
        stats: Mapping[str, StatInput] | None = None,
        key: str | None = None,
    ) -> None:
        """An event from `start_us` to `end_us` in the trace's clock (its offset is taken from the line's start);
        `key` names its metadata where two share a name (a TPU op of two programs)."""
        mid = self.plane.event_id(name, key=key)
        start_ps = round(start_us * 1_000_000) - self.timestamp_ns * 1000
        self.events.append((mid, start_ps, round((end_us - start_us) * 1_000_000), dict(stats or {})))

    def encode(self) -> bytes:
        out = [_int(1, self.id), _str(2, self.name), _int(3, self.timestamp_ns)]
        for mid, offset, duration, stats in self.events:
            body = _int(1, mid) + _int(2, offset) + _int(3, duration)
            body += b"".join(_delimited(4, self.plane.stat(k, v)) for k, v in stats.items())
            out.append(_delimited(4, body))
        out += [_str(11, self.display_name)]
        return b"".join(out)


@dataclass
class FakePlane:
    name: str
    id: int = 0
    lines: list[FakeLine] = field(default_factory=list)
    stats: dict[str, StatInput] = field(default_factory=dict)
    event_ids: dict[str, int] = field(default_factory=dict)
    event_metadata_stats: dict[str, dict[str, StatInput]] = field(default_factory=dict)
    stat_ids: dict[str, int] = field(default_factory=dict)
    event_names: dict[str, str] = field(default_factory=dict)  # metadata key -> name, where they differ

    def line(self, name: str, *, id: int | None = None, timestamp_ns: int = 0, display_name: str = "") -> FakeLine:
        line = FakeLine(self, len(self.lines) + 1 if id is None else id, name, timestamp_ns, display_name)
        self.lines.append(line)
        return line

    def event_id(self, name: str, stats: Mapping[str, StatInput] | None = None, key: str | None = None) -> int:
        """The event metadata id of `name` (made on first use; ids from 1, as XPlaneBuilder's), with stats that
        every event of that name shares (`hlo_category` on a TPU op); `key` (default: the name) tells apart two
        metadata of one name (a TPU op of two programs)."""
        key = name if key is None else key
        self.event_names[key] = name
        if key not in self.event_ids:
            self.event_ids[key] = len(self.event_ids) + 1
        if stats:
            self.event_metadata_stats.setdefault(key, {}).update(stats)
        return self.event_ids[key]

    def stat_id(self, name: str) -> int:
        if name not in self.stat_ids:
            self.stat_ids[name] = len(self.stat_ids) + 1
        return self.stat_ids[name]

    def stat(self, name: str, value: StatInput) -> bytes:
        """An encoded XStat."""
        out = _int(1, self.stat_id(name))
        if isinstance(value, Ref):
            return out + _key(7, 0) + varint(self.stat_id(value))
        if isinstance(value, Uint):
            return out + _key(3, 0) + varint(value)
        if isinstance(value, bool | int):
            return out + _key(4, 0) + varint(int(value))
        if isinstance(value, float):
            return out + _key(2, 1) + struct.pack("<d", value)
        if isinstance(value, str):
            return out + _delimited(5, value.encode())
        return out + _delimited(6, value)

    def encode(self) -> bytes:
        lines = b"".join(_delimited(3, line.encode()) for line in self.lines)
        stats = b"".join(_delimited(6, self.stat(k, v)) for k, v in self.stats.items())  # registers stat names
        event_meta = b""
        for key, mid in self.event_ids.items():
            meta_stats = self.event_metadata_stats.get(key, {})
            name = self.event_names.get(key, key)
            body = (
                _int(1, mid) + _str(2, name) + b"".join(_delimited(5, self.stat(k, v)) for k, v in meta_stats.items())
            )
            event_meta += _delimited(4, _int(1, mid) + _delimited(2, body))
        # Stat metadata last: every stat above (and each Ref's string) has registered its name by now.
        stat_meta = b"".join(
            _delimited(5, _int(1, sid) + _delimited(2, _int(1, sid) + _str(2, name)))
            for name, sid in self.stat_ids.items()
        )
        return _int(1, self.id) + _str(2, self.name) + lines + event_meta + stat_meta + stats


@dataclass
class FakeSpace:
    planes: list[FakePlane] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=lambda: ["fakehost"])

    def plane(self, name: str, *, id: int = 0) -> FakePlane:
        plane = FakePlane(name, id)
        self.planes.append(plane)
        return plane

    def task_environment(self, start_unix_ns: int, stop_unix_ns: int) -> None:
        """The plane where tsl records the profile's start and stop (Unix ns), as jax 0.10.2 writes it."""
        self.plane("Task Environment").stats.update(
            {"profile_start_time": Uint(start_unix_ns), "profile_stop_time": Uint(stop_unix_ns)}
        )

    def encode(self) -> bytes:
        return b"".join(_delimited(1, p.encode()) for p in self.planes) + b"".join(
            _delimited(4, h.encode()) for h in self.hostnames
        )


# ------------------------------------------------------------------------------------------------------ GPU layout


@dataclass(frozen=True)
class Kernel:
    """One event on a GPU stream: a kernel (XLA's, with its `hlo_op`, or NCCL's) or a Memcpy."""

    stream: int
    name: str
    start_us: float
    end_us: float
    hlo_op: str = ""
    memcpy: str = ""  # memcpy_details, e.g. "kind_src:device kind_dst:pinned num_bytes:4096"
    module: str = ""  # its program (hlo_module, program_id stats): the space's module and 17 by default
    program_id: int = 17


START_UNIX_NS = 1_796_205_901_732_605_833  # a profile_start_time as jax 0.10.2 wrote one


def gpu_space(
    devices: Mapping[int, Iterable[Kernel]], *, module: str = "jit_train_step", profile_us: int = 100
) -> bytes:
    """A GPU host's XSpace: per device a `/device:GPU:N` plane with a line per stream, and the lines a reader must
    skip: the derived `XLA Modules` (one event over the module's whole run), `XLA Ops` and `Steps` lines, and a
    `CUPTI overhead` line; a `/host:CPU` plane whose launch events carry `hlo_op` and `device_ordinal` (the launches,
    not device time); and the `Task Environment` plane (a `profile_us` profile)."""
    space = FakeSpace()
    host = space.plane("/host:CPU")
    launcher = host.line("python", id=4242)
    for ordinal, kernels in sorted(devices.items()):
        kernels = list(kernels)
        plane = space.plane(f"/device:GPU:{ordinal}", id=ordinal + 1)
        plane.stats.update(
            {"device_vendor": "Nvidia", "compute_capability_major": 9, "memory_bandwidth": Uint(4_800_000_000_000)}
        )
        first = min(k.start_us for k in kernels)
        last = max(k.end_us for k in kernels)
        plane.line("XLA Modules", id=-1).event(f"{module}(7061549210742335213)", first, last, {"run_id": 1})
        plane.line("Steps", id=-2).event("0", 0, profile_us, {"group_id": 0})
        ops = plane.line("XLA Ops", id=-3)
        plane.line("CUPTI overhead", id=99).event("CUPTI overhead", first, last)
        by_stream: dict[int, list[Kernel]] = {}
        for k in kernels:
            by_stream.setdefault(k.stream, []).append(k)
        for stream, on_stream in sorted(by_stream.items()):
            kinds = sorted({k.name if k.memcpy else "Kernel" for k in on_stream})
            line = plane.line(f"Stream #{stream}({','.join(kinds)})", id=stream, timestamp_ns=5_000)
            for k in on_stream:
                stats: dict[str, StatInput] = {"correlation_id": Uint(len(line.events) + 100), "group_id": 0}
                if k.hlo_op:
                    stats.update({"hlo_op": Ref(k.hlo_op), "hlo_module": Ref(k.module or module),
                                  "program_id": k.program_id})  # fmt: skip
                    ops.event(k.hlo_op, k.start_us, k.end_us, {"hlo_module": module})
                if k.memcpy:
                    stats["memcpy_details"] = k.memcpy
                else:
                    stats["kernel_details"] = "regs:32 static_shared:0 grid:132,1,1 block:256,1,1"
                line.event(k.name, k.start_us, k.end_us, stats)
                if k.hlo_op:  # the launch on the host: an XLA op's TraceMe, not time on the device
                    launcher.event(
                        k.hlo_op, max(0.0, k.start_us - 1), k.start_us, {"hlo_op": k.hlo_op, "device_ordinal": ordinal}
                    )
    space.task_environment(START_UNIX_NS, START_UNIX_NS + profile_us * 1000)
    return space.encode()


# ------------------------------------------------------------------------------------------------------ TPU layout


@dataclass(frozen=True)
class TpuOp:
    """One op on a TPU's `XLA Ops` line (or, `asynchronous`, on `Async XLA Ops`: from its start to its done)."""

    name: str
    start_us: float
    end_us: float
    category: str
    asynchronous: bool = False
    # Its program: `XLA Modules` names it `module(program_id)` over its ops' span (by default the space's module and
    # 12190760917235803885); `bare`: its metadata carries no program_id (only the span tells).
    module: str = ""
    program_id: int = 12190760917235803885
    bare: bool = False


def tpu_space(
    devices: Mapping[int, Iterable[TpuOp]], *, module: str = "jit_train_step", profile_us: int = 100
) -> bytes:
    """A TPU host's XSpace: per chip core a `/device:TPU:N` plane with `XLA Modules`, `XLA Ops`, `Async XLA Ops`
    and `XLA TraceMe` lines, each op's `hlo_category` on its event metadata as XProf's TPU planes carry it."""
    space = FakeSpace()
    for ordinal, ops in sorted(devices.items()):
        ops = list(ops)
        plane = space.plane(f"/device:TPU:{ordinal}", id=ordinal)
        plane.stats.update({"core_details": b"\x08\x01", "peak_teraflops_per_second": 918.0})
        first = min(o.start_us for o in ops)
        last = max(o.end_us for o in ops)
        runs = plane.line("XLA Modules", id=1)
        programs: dict[tuple[str, int], list[TpuOp]] = {}
        for op in ops:
            programs.setdefault((op.module or module, op.program_id), []).append(op)
        if len(programs) == 1:
            runs.event(f"{module}(12190760917235803885)", first, last, {"run_id": 3})
        else:  # each program's run over its ops' span
            for (name, program), its in sorted(programs.items(), key=lambda kv: min(o.start_us for o in kv[1])):
                start, end = min(o.start_us for o in its), max(o.end_us for o in its)
                runs.event(f"{name}({program})", start, end, {"run_id": 3})
        sync = plane.line("XLA Ops", id=2, timestamp_ns=1_000)
        asynchronous = plane.line("Async XLA Ops", id=3, timestamp_ns=1_000)
        plane.line("XLA TraceMe", id=4).event("ExecuteOnDevice", 0, profile_us)
        for op in ops:
            key = f"{op.name}@{op.program_id}"
            meta: dict[str, StatInput] = {"hlo_category": op.category}
            if not op.bare:
                meta["program_id"] = Uint(op.program_id)
            plane.event_id(op.name, meta, key=key)
            line = asynchronous if op.asynchronous else sync
            line.event(op.name, op.start_us, op.end_us, {"run_id": 3}, key=key)
    space.task_environment(START_UNIX_NS, START_UNIX_NS + profile_us * 1000)
    return space.encode()
