"""The window MFU, HFU and the stall check are taken over, and the step-duration histogram: their sums kept as steps
enter and leave, so that reading them is O(devices) whatever the window's length (accounting.py fills them)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Buckets of jaxmon_training_step_duration_seconds: from milliseconds to minutes, fixed so that histograms of every
# process of a job aggregate (sum by le).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0, 600.0,
)  # fmt: skip


@dataclass
class Histogram:
    """A cumulative histogram with fixed upper bounds (Prometheus `le`), sum and count."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        """Count `value` in its bucket."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), +Inf last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class WindowStep(NamedTuple):
    """One step of the window: its interval, its busy part, the part MFU counts (less named badput), and its FLOPs
    per device (a tuple: the cheapest record to make, once a step)."""

    duration: float
    busy: float
    counted: float
    model_flops: Mapping[tuple[str, int], float]
    hardware_flops: Mapping[tuple[str, int], float]


class RunningSum:
    """A sum that values enter and leave, compensated (Neumaier's variant of Kahan's summation): the window's
    seconds and FLOPs are kept this way so that reading them is O(1), without the drift of a plain running sum.

    A plain `+=`/`-=` pair loses the low bits of every value it adds to a larger total, and they never come back when
    that value leaves: over millions of steps the window's total drifts, worst after a huge value (a 10-minute
    stall, a step of 1e18 FLOPs) entered and left it. The compensation carries those low bits, so the error stays
    within a few ulps of the true total whatever went through it. A sum whose last value left is reset to exactly
    0 (the caller counts its values)."""

    __slots__ = ("compensation", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.compensation = 0.0

    def add(self, value: float) -> None:
        """Add `value` (subtract with its negation)."""
        total = self.total + value
        if abs(self.total) >= abs(value):
            self.compensation += (self.total - total) + value
        else:
            self.compensation += (value - total) + self.total
        self.total = total

    def value(self) -> float:
        """The sum."""
        return self.total + self.compensation


class WindowSums:
    """The window's counted seconds and its steps' per-device model and hardware FLOPs, kept as steps enter and
    leave it: MFU and HFU are read in O(devices x distinct FLOPs mappings), whatever the window's length (the tracker
    reads them under its lock).

    A step's FLOPs mapping is kept by reference and counted: the tracker hands the same mapping for every step of the
    same figure and tracked calls (a loop has a few), so a step entering or leaving costs a dict update, not one per
    device. The mappings are never written to once handed over. The sum read is each mapping's values times its
    count, exactly as the definition (no running sum to drift)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """An empty window: every sum exactly 0."""
        self.seconds = RunningSum()
        self.steps = 0
        self.model: dict[int, list[Any]] = {}  # id(mapping) -> [mapping, steps of the window with it]
        self.hardware: dict[int, list[Any]] = {}

    def enter(self, step: WindowStep) -> None:
        """`step` joins the window."""
        self.steps += 1
        self.seconds.add(step.counted)
        if step.model_flops:
            _enter(self.model, step.model_flops)
        if step.hardware_flops:
            _enter(self.hardware, step.hardware_flops)

    def enter_run(
        self,
        steps: int,
        seconds: float,
        model: Mapping[tuple[str, int], float],
        hardware: Mapping[tuple[str, int], float],
    ) -> None:
        """`steps` steps of `seconds` in all (none named badput), each with these FLOPs mappings, join the window."""
        self.steps += steps
        self.seconds.add(seconds)
        for kept, flops in ((self.model, model), (self.hardware, hardware)):
            if flops:
                entry = kept.get(id(flops))
                if entry is None:
                    kept[id(flops)] = [flops, steps]
                else:
                    entry[1] += steps

    def leave_run(self, steps: list[WindowStep]) -> None:
        """`steps` (in the window) leave it, as leave() of each."""
        if len(steps) >= self.steps:
            self.clear()
            return
        self.steps -= len(steps)
        self.seconds.add(-math.fsum(step.counted for step in steps))
        for kept, index in ((self.model, 3), (self.hardware, 4)):
            leaving: dict[int, int] = {}
            for step in steps:
                if step[index]:
                    leaving[id(step[index])] = leaving.get(id(step[index]), 0) + 1
            for key, count in leaving.items():
                entry = kept[key]
                if entry[1] == count:  # its last steps leave: exactly nothing, as a recomputation would say
                    del kept[key]
                else:
                    entry[1] -= count

    def leave(self, step: WindowStep) -> None:
        """`step` (in the window) leaves it; the window that empties is exactly 0 again."""
        self.steps -= 1
        if self.steps == 0:
            self.clear()
            return
        self.seconds.add(-step.counted)
        if step.model_flops:
            _leave(self.model, step.model_flops)
        if step.hardware_flops:
            _leave(self.hardware, step.hardware_flops)

    @staticmethod
    def total(kept: dict[int, list[Any]], key: tuple[str, int]) -> float | None:
        """The window's FLOPs of device `key` (None: no step of the window names it)."""
        parts = [mapping[key] * count for mapping, count in kept.values() if key in mapping]
        return math.fsum(parts) if parts else None


def _enter(kept: dict[int, list[Any]], flops: Mapping[tuple[str, int], float]) -> None:
    entry = kept.get(id(flops))
    if entry is None:
        kept[id(flops)] = [flops, 1]
    else:
        entry[1] += 1


def _leave(kept: dict[int, list[Any]], flops: Mapping[tuple[str, int], float]) -> None:
    entry = kept[id(flops)]
    if entry[1] == 1:  # its last step leaves: exactly nothing, as a recomputation would say
        del kept[id(flops)]
    else:
        entry[1] -= 1
