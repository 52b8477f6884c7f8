"""What `jaxmon snapshot` prints: a table for people, or JSON."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from jaxmon.collectors.memory import MemoryCollector, MemoryState
from jaxmon.collectors.nvml import NvmlCollector, NvmlState
from jaxmon.collectors.probe import ProbeCollector, ProbeState
from jaxmon.device_readings import ProbeStatus
from jaxmon.snapshot import Snapshot


def human_bytes(value: int | None) -> str:
    """Bytes in binary units for people (the metrics stay in bytes)."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3f}"


def _probe(state: ProbeState, key: tuple[str, int]) -> ProbeStatus | None:
    """A device's probe status: its own, or that of the CPU device probed for it."""
    own = state.statuses.get(key)
    stand_in = state.shared.get(key)
    return own if own is not None or stand_in is None else state.statuses.get(stand_in)


def format_table(snap: Snapshot) -> str:
    """One row per device: memory, fragmentation, headroom, and the probe."""
    header = [
        "device",
        "kind",
        "in use",
        "limit",
        "free",
        "frag",
        "allocatable",
        "probe ms",
        "baseline ms",
        "util",
        "up",
    ]
    errors: list[str] = []  # whole, under the table: a cell would cut them mid-word
    memory = snap.state(MemoryCollector.name, MemoryState) or MemoryState()
    probes = snap.state(ProbeCollector.name, ProbeState) or ProbeState()
    # Only an allocator with a stack (TPU) reports reservations: the column is there where one does.
    reserved = any(r.numbers is not None and r.numbers.reserved_bytes is not None for r in memory.readings.values())
    if reserved:
        header.insert(3, "reserved")
    rows = [header]
    for d in snap.devices:
        reading = memory.readings.get(d.key)
        probe = _probe(probes, d.key)
        n = reading.numbers if reading else None
        mem: list[str]
        if reading is not None and not reading.ok:
            mem = ["error (below)", *["-"] * (4 + reserved)]
            errors.append(f"{d.name}: memory_stats failed: {reading.error}")
        elif n is None or not n.supported:
            mem = ["unsupported", *["-"] * (4 + reserved)]
        else:
            mem = [
                human_bytes(n.bytes_in_use),
                *([human_bytes(n.reserved_bytes)] if reserved else []),
                human_bytes(n.limit_bytes),
                human_bytes(n.free_bytes),
                _ratio(n.fragmentation_ratio),
                human_bytes(n.largest_allocatable_bytes),
            ]
        if probe is None:
            pr = ["-", "-", "-", "-"]
        else:
            up = "-" if probe.up is None else ("yes" if probe.up else "NO")
            pr = [
                _ms(probe.last_duration_seconds),
                _ms(probe.baseline_seconds),
                _ratio(probe.utilization_ratio),
                up,
            ]
        rows.append([d.name, d.device_kind, *mem, *pr])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.extend(errors)
    for probed in sorted(set(probes.shared.values())):
        lines.append(f"CPU devices share the host's cores: {probed[0]}:{probed[1]} is probed for all of them")
    down = [b for b in snap.backends if not b.up]
    for b in down:
        lines.append(f"backend {b.name} is down: {b.error}")
    nvml = snap.state(NvmlCollector.name, NvmlState)
    if nvml is not None:
        lines += ["", *_nvml_table(nvml)]
    return "\n".join(lines)


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _nvml_table(state: NvmlState) -> list[str]:
    """One row per GPU as NVML reads it, device-wide (all processes)."""
    if state.error is not None:
        return [f"nvml: {state.error}"]
    header = ["nvml gpu", "name", "used", "total", "duty", "power W", "limit W", "temp C", "up"]
    rows = [header]
    for g in state.gpus:
        rows.append(
            [
                str(g.index),
                g.name or "-",
                human_bytes(g.memory_used_bytes),
                human_bytes(g.memory_total_bytes),
                _ratio(g.duty_cycle_ratio),
                _number(g.power_watts, ".1f"),
                _number(g.power_limit_watts, ".1f"),
                _number(g.temperature_celsius, ".0f"),
                "yes" if g.up else f"NO: {g.error}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """JSON-friendly view of the devices, their memory and their probe."""
    memory = snap.state(MemoryCollector.name, MemoryState) or MemoryState()
    probes = snap.state(ProbeCollector.name, ProbeState) or ProbeState()
    out: list[dict[str, Any]] = []
    for dev in snap.devices:
        reading = memory.readings.get(dev.key)
        probe = _probe(probes, dev.key)
        out.append(
            {
                **dev.identity(),
                "memory": reading.numbers.as_dict() if reading and reading.numbers else None,
                "memory_error": reading.error if reading else None,
                "live_array_bytes": memory.live_array_bytes.get(dev.key),
                "probe": vars(probe).copy() if probe else None,
                # The device whose probe this is: itself, or the CPU device probed for every CPU device.
                "probed_device": None if probe is None else "{}:{}".format(*probes.shared.get(dev.key, dev.key)),
            }
        )
    nvml = snap.state(NvmlCollector.name, NvmlState)
    return {
        "source": snap.source,
        "build": dict(snap.build),
        "backends": [vars(b).copy() for b in snap.backends],
        "devices": out,
        # Device-wide GPU readings, where the nvml collector ran (None otherwise).
        "nvml": None
        if nvml is None
        else {
            "error": nvml.error,
            "gpus": [asdict(g) for g in nvml.gpus],
            "xid": [{"gpu": gpu, "xid": xid, "count": n} for (gpu, xid), n in sorted(nvml.xid.items())],
        },
    }
