"""The sampled traces' totals per device: profiled time, its four parts (compute, exposed collective, copy, idle),
collective time by op, and placed collective bytes by (op, axes, link). The sampler adds each sample's split here
(under its lock) and reads them out for the exporter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxmon.training.trace_links import PlacedTotals
from jaxmon.training_readings import DeviceProfile


@dataclass
class _Totals:
    profiled: float = 0.0
    compute: float = 0.0
    collective: float = 0.0
    copy: float = 0.0
    idle: float = 0.0
    collectives: dict[str, float] = field(default_factory=dict)
    placed: PlacedTotals = field(default_factory=PlacedTotals)  # by (op, axes, link): trace_links


class ProfileTotals:
    """Each device's totals over the samples taken (not thread-safe: the sampler holds its lock)."""

    def __init__(self) -> None:
        self._devices: dict[tuple[str, int], _Totals] = {}

    def add(
        self, split: Mapping[Any, tuple[float, Any, Mapping[str, float], Any]], keys: Mapping[Any, Any]
    ) -> dict[str, int]:
        """One sample's split (trace device -> (seconds, parts, collective seconds by op, placed)), its devices named
        by `keys` (the trace's (platform, ordinal) -> the training families' device key); returns the collective
        events it could not place, by why."""
        unplaced: dict[str, int] = {}
        for device, (seconds, parts, collectives, placed) in split.items():
            totals = self._devices.setdefault(keys.get(device, device), _Totals())
            totals.profiled += seconds
            totals.compute += parts[0]
            totals.collective += parts[1]
            totals.copy += parts[2]
            totals.idle += parts[3]
            for op, value in collectives.items():
                totals.collectives[op] = totals.collectives.get(op, 0.0) + value
            totals.placed.merge(placed)
            for why, count in placed.unplaced.items():
                unplaced[why] = unplaced.get(why, 0) + count
        return unplaced

    def devices(self) -> tuple[DeviceProfile, ...]:
        """Each device's totals now, in device order."""
        return tuple(
            DeviceProfile(
                platform=platform,
                id=device,
                profiled_seconds_total=t.profiled,
                parts={"compute": t.compute, "collective": t.collective, "copy": t.copy, "idle": t.idle},
                collectives=dict(t.collectives),
                placed=t.placed.table(),
                copies=t.placed.copies(),
            )
            for (platform, device), t in sorted(self._devices.items())
        )
