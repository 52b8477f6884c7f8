"""Where a traced window's time goes on each local device: compute, exposed collectives, copies, idle.

    trace = read(open(".../plugins/profile/<date>/<host>.xplane.pb", "rb").read())
    t0 = trace.trace_ns(first_step_start_unix_ns)       # the steps the trace was meant to hold
    for device, split in trace.split(t0, trace.trace_ns(last_step_end_unix_ns)).items():
        split.compute + split.collective + split.copy + split.idle == split.window   # picoseconds, exactly

The trace's clock: jax's `stop_trace()` (tsl's post-processing) rewrites every line's timestamp as nanoseconds since
the profile started, and records the start and stop in the `Task Environment` plane's `profile_start_time` and
`profile_stop_time` stats (Unix ns; seen on jax 0.10.2: a `stop_trace` event at 20.09 ms of a 20.47 ms profile).
`trace_ns()` converts a `time.time_ns()` reading to that clock. Without a window the split covers the whole
profile (start to stop, or the events' extent when the stats are missing).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from jaxmon.xla.classify import Device, Known, Run, device_segments
from jaxmon.xla.intervals import Segment, Split, split
from jaxmon.xla.xspace import XSpace, parse

__all__ = ["Trace", "read"]

PS_PER_NS = 1000


@dataclass(frozen=True)
class Trace:
    """A parsed profile's device activity: read once, split over as many windows as wanted."""

    segments: dict[Device, list[Segment]]
    modules: frozenset[str]
    hostnames: tuple[str, ...]
    start_unix_ns: int | None
    stop_unix_ns: int | None
    runs: dict[Device, list[Run]] = field(default_factory=dict)  # each device's program runs (ps)

    @property
    def devices(self) -> list[Device]:
        return sorted(self.segments)

    def extent_ns(self) -> tuple[int, int]:
        """The whole profile in the trace's clock: [0, stop - start], or the span of the device events."""
        if self.start_unix_ns is not None and self.stop_unix_ns is not None:
            return 0, max(0, self.stop_unix_ns - self.start_unix_ns)
        starts = [s[0] for segs in self.segments.values() for s in segs]
        ends = [s[1] for segs in self.segments.values() for s in segs]
        if not starts:
            return 0, 0
        return min(starts) // PS_PER_NS, -(-max(ends) // PS_PER_NS)

    def step_windows(self, windows: list[tuple[int, int]]) -> dict[Device, list[tuple[int, int]]]:
        """Each device's picosecond windows for steps' `windows` (the trace's ns, in order, none overlapping). An
        edge that cuts one of the device's program runs is a completion dated off the device's own: late by the
        host's wake (inside the next step's first run), or early by an inferred date or the two clocks' offset. It
        moves to the run's nearer end. Nearer its start: back to the end of the run before it (or to its own start,
        where that end lies beyond the edge before, or too far). Nearer its end: on to that end, but for the trace's
        last run, taken as the next step's (the trace's stop cut it short: its "end" is the last op done by then,
        and the block's last completion came before the stop). A move is at most
        half the shorter window the edge bounds (a run longer than that is no step's: a trace whose one run spans the
        block) and never past a neighbouring edge: the windows keep their order. An edge in an idle gap is kept; one
        between two runs of a step of several programs moves to one of them (the block's windows still sum its
        steps)."""
        edges = sorted({edge for window in windows for edge in window})
        reach: dict[int, int] = {}  # each edge's longest move (ps): half the shorter window it bounds
        for a, b in windows:
            for edge in (a, b):
                reach[edge] = min(reach.get(edge, b - a), b - a) * PS_PER_NS // 2
        out: dict[Device, list[tuple[int, int]]] = {}
        for device in self.segments:
            runs = sorted(self.runs.get(device, []))
            starts = [start for start, _ in runs]
            ends = sorted(end for _, end in runs)
            last = ends[-1] if ends else None  # the end of the run the trace's stop may have cut
            moved: dict[int, int] = {}
            floor = -1  # the edge before, as moved
            for index, edge in enumerate(edges):
                ps = moved[edge] = edge * PS_PER_NS
                ceiling = edges[index + 1] * PS_PER_NS if index + 1 < len(edges) else None
                i = bisect_right(starts, ps) - 1  # the last run begun by the edge: cut if it ends after it
                if i >= 0 and runs[i][1] > ps:
                    start, end = runs[i]
                    j = bisect_right(ends, start) - 1  # the last run that ended before the cut one began
                    if end - ps < ps - start and end != last:  # nearer the run's end: the step's own, dated early
                        if (ceiling is None or end < ceiling) and end - ps <= reach[edge]:
                            moved[edge] = end
                    else:  # nearer its start: the next step's, dated late (the trace's last run: the next step's cut)
                        back = [ends[j]] if j >= 0 else []
                        moved[edge] = next((t for t in [*back, start] if floor < t and ps - t <= reach[edge]), ps)
                floor = moved[edge]
            out[device] = [(moved[a], moved[b]) for a, b in windows]
        return out

    def split_ps(self, device: Device, t0_ps: int, t1_ps: int) -> Split:
        """One device's split of [t0_ps, t1_ps] (the trace's clock, picoseconds: step_windows())."""
        if t1_ps < t0_ps:
            raise ValueError(f"window ends at {t1_ps} ps, before it starts at {t0_ps} ps")
        return split(self.segments[device], t0_ps, t1_ps)

    def trace_ns(self, unix_ns: int) -> int:
        """A Unix time (`time.time_ns()`) in the trace's clock."""
        if self.start_unix_ns is None:
            raise ValueError("the profile has no profile_start_time: its clock cannot be related to Unix time")
        return unix_ns - self.start_unix_ns

    def split(self, t0_ns: int | None = None, t1_ns: int | None = None) -> dict[Device, Split]:
        """Each device's split of [t0_ns, t1_ns] (the trace's clock; the whole profile by default)."""
        lo, hi = self.extent_ns()
        t0 = lo if t0_ns is None else t0_ns
        t1 = hi if t1_ns is None else t1_ns
        if t1 < t0:
            raise ValueError(f"window ends at {t1} ns, before it starts at {t0} ns")
        return {d: split(segs, t0 * PS_PER_NS, t1 * PS_PER_NS) for d, segs in sorted(self.segments.items())}


def _int_stat(space: XSpace, name: str) -> int | None:
    plane = space.plane("Task Environment")
    value = plane.stats.get(name) if plane is not None else None
    return value if isinstance(value, int) else None


def read(data: bytes, collectives: Known | None = None) -> Trace:
    """Parse a serialized XSpace and classify its device events (raises XSpaceError, a ValueError, on bad bytes).

    `collectives`: the collective instructions of the traced programs by name, with their kind, e.g.
    `{c.name: c.op for p in programs for c in p.collectives}` from `jaxmon.xla.hlo.parse(compiled.as_text())`, or a
    Namer that tells the programs apart (jaxmon.training.trace_links.Catalog); without it collectives are recognised
    by opcode or JAX primitive name (classify.py)."""
    space = parse(data)
    segments, modules, runs = device_segments(space, collectives or {})
    return Trace(
        segments,
        frozenset(modules),
        tuple(space.hostnames),
        _int_stat(space, "profile_start_time"),
        _int_stat(space, "profile_stop_time"),
        runs,
    )
