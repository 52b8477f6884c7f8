"""The sampled traces' totals per device: profiled time, its four parts (compute, exposed collective, copy, idle),
collective time by op, and placed collective bytes by (op, axes, link); and the last sample's own collective wait
per device, with the step it began at. The sampler adds each sample's split here (under its lock) and reads them out
for the exporter."""

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
    wait: float | None = None  # the last sample's collective part over its time (None: not in the last sample)


class ProfileTotals:
    """Each device's totals over the samples taken (not thread-safe: the sampler holds its lock)."""

    def __init__(self) -> None:
        self._devices: dict[tuple[str, int], _Totals] = {}
        self.sample_step: int | None = None  # the first step of the last sample added

    def add(
        self,
        split: Mapping[Any, tuple[float, Any, Mapping[str, float], Any]],
        keys: Mapping[Any, Any],
        step: int | None = None,
    ) -> dict[str, int]:
        """One sample's split (trace device -> (seconds, parts, collective seconds by op, placed)) of the steps from
        `step` on, its devices named by `keys` (the trace's (platform, ordinal) -> the training families' device
        key); returns the collective events it could not place, by why."""
        unplaced: dict[str, int] = {}
        for totals in self._devices.values():
            totals.wait = None  # a device this sample does not hold has no wait of this sample's
        self.sample_step = step
        for device, (seconds, parts, collectives, placed) in split.items():
            totals = self._devices.setdefault(keys.get(device, device), _Totals())
            totals.wait = min(max(parts[1] / seconds, 0.0), 1.0) if seconds > 0 else None
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
                sample_wait_ratio=t.wait,
            )
            for (platform, device), t in sorted(self._devices.items())
        )
