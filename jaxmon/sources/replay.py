"""Replayed devices (DESIGN.md section 8): recorded `memory_stats()` dicts served as if they were live."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jaxmon.device_readings import BackendStatus, DeviceInfo, ProbeKernel

StatsDict = dict[str, int | float | None]


class ReplayError(ValueError):
    """The replay file cannot be used; the message names the file and what is wrong."""


class ReplayedDeviceError(RuntimeError):
    """Raised by a replayed device whose entry has `error`, like a device whose memory_stats() raises."""


class ReplayDevice(BaseModel):
    """One device entry of a replay file."""

    model_config = ConfigDict(extra="forbid")

    id: int = Field(ge=0)
    platform: str = Field(min_length=1)
    device_kind: str = "unknown"
    process_index: int = Field(default=0, ge=0)
    coords: list[int] | None = None
    core_on_chip: int | None = None
    memory_stats: StatsDict | list[StatsDict] | None = None
    error: str | None = None

    @field_validator("memory_stats")
    @classmethod
    def _non_empty_list(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("a list of memory_stats must hold at least one dict")
        return value


class ReplayFile(BaseModel):
    """Top level of a replay file."""

    model_config = ConfigDict(extra="forbid")

    devices: list[ReplayDevice]

    @field_validator("devices")
    @classmethod
    def _unique_devices(cls, value: list[ReplayDevice]) -> list[ReplayDevice]:
        seen: set[tuple[str, int]] = set()
        for dev in value:
            key = (dev.platform, dev.id)
            if key in seen:
                raise ValueError(f"device {dev.platform}:{dev.id} appears twice")
            seen.add(key)
        return value


_NUMBER_ERRORS = ("int_", "float_")


def _field_path(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """`loc` without pydantic's union-member tags (`dict[str,nullable[union[int,float]]]`, `int`, `float`)."""
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("int", "float", "str", "bool"))))


def _describe(err: ValidationError) -> str:
    """One entry per field of the file: where it is (devices.0.memory_stats.bytes_in_use) and what it must be.

    A value that fits no member of a union gets one error per member; the member that got furthest into the
    value (the deepest path) is the one the user meant, and int-or-float failures read as "a number".
    """
    by_path: dict[tuple[int | str, ...], list[Any]] = {}
    for e in err.errors():
        by_path.setdefault(_field_path(e["loc"]), []).append(e)
    deepest = [p for p in by_path if not any(q[: len(p)] == p and len(q) > len(p) for q in by_path)]
    parts = []
    for path in deepest:
        errors = by_path[path]
        given = errors[0].get("input")
        if errors[0]["type"] == "extra_forbidden":
            message = "no such field"
        elif all(str(e["type"]).startswith(_NUMBER_ERRORS) for e in errors):
            message = f"must be a number (got {given!r})"
        else:
            message = str(errors[0]["msg"]).removeprefix("Value error, ")
        parts.append(f"{'.'.join(str(p) for p in path) or 'top level'}: {message}")
    return "; ".join(parts)


def load_replay(path: Path) -> ReplayFile:
    """Parse and validate a replay file, raising ReplayError with the file and the offending field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayError(f"replay file {path}: cannot read: {exc.strerror or exc}") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"replay file {path}: not JSON: {exc}") from exc
    try:
        return ReplayFile.model_validate(raw)
    except ValidationError as exc:
        raise ReplayError(f"replay file {path}: {_describe(exc)}") from exc


class ReplaySource:
    """A device source backed by a replay file; lists are replayed one entry per poll, cycling."""

    name = "replay"
    runs_probes = False

    def __init__(self, path: Path) -> None:
        self._file = load_replay(path)
        self._lock = threading.Lock()
        self._cursor: dict[tuple[str, int], int] = {}
        self._entries = {(d.platform, d.id): d for d in self._file.devices}

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """The recorded devices, and one backend per recorded platform."""
        devices = [
            DeviceInfo(
                id=d.id,
                platform=d.platform,
                device_kind=d.device_kind,
                process_index=d.process_index,
                coords=",".join(str(c) for c in d.coords) if d.coords is not None else None,
                core_on_chip=d.core_on_chip,
            )
            for d in self._file.devices
        ]
        platforms = sorted({d.platform for d in devices})
        return devices, [BackendStatus(name=p, up=True) for p in platforms]

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """The next recorded stats of `device`, raising when the entry records an error."""
        entry = self._entries[device.key]
        if entry.error is not None:
            raise ReplayedDeviceError(entry.error)
        stats = entry.memory_stats
        if isinstance(stats, list):
            with self._lock:
                i = self._cursor.get(device.key, 0)
                self._cursor[device.key] = i + 1
            return stats[i % len(stats)]
        return stats

    def make_probe(self, device: DeviceInfo, size: int) -> ProbeKernel | None:
        """Replayed devices run no probe."""
        return None
