"""A sampled trace's collectives by (op, axes, link): each event attributed to its HLO instruction's place.

The analysis thread placed every collective instruction of the tracked programs (jaxmon.training.links: its op, the
mesh axes its groups span, the slowest link they cross, its bytes per device and execution). The sampler's thread
names each trace event's kind by its instruction (`kinds()`: `op SEP axes SEP link SEP name`), so the split keeps
each instruction apart (jaxmon.xla.intervals), and `PlacedTotals.add()` sums a window's split per (op, axes,
link): the time each ran (overlapped with compute or not), its exposed time (no compute running) and the bytes of
its events inside the window (events x the instruction's bytes, nccl-tests' convention). An event the analysis did
not name (a program not tracked, or not analysed yet) counts under its opcode's kind with axes "" and link
"unknown", and adds no bytes (never a guess). Pure: no JAX; the sampler's thread runs it once per sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from jaxmon.xla.intervals import Split
from jaxmon.xla.profile import Trace

SEP = "\x1f"
Place = tuple[str, str, str]
UNPLACED_LINK = "unknown"
# (op, axes, link) series per device at most (as the collective bytes' MAX_PAIRS): a new one past it is not counted.
MAX_PLACES = 256
PS = 1e-12


def kinds(names: Mapping[str, str], places: Mapping[str, tuple[str, str, str, float]]) -> dict[str, str]:
    """Instruction name -> the kind its trace events are classified as: the placed ones by name and place, the
    others by their op (jaxmon.xla.classify's `collectives`)."""
    out = dict(names)
    for name, (op, axes, link, _) in places.items():
        out[name] = SEP.join((op, axes, link, name))
    return out


def place_of(kind: str) -> tuple[Place, str | None]:
    """(op, axes, link) of a split's collective kind, and the instruction's name (None: not placed)."""
    parts = kind.split(SEP)
    if len(parts) == 4:
        return (parts[0], parts[1], parts[2]), parts[3]
    return (kind, "", UNPLACED_LINK), None


@dataclass
class PlacedTotals:
    """One device's sampled collectives by (op, axes, link): seconds run, exposed seconds, bytes."""

    seconds: dict[Place, float] = field(default_factory=dict)
    exposed: dict[Place, float] = field(default_factory=dict)
    bytes: dict[Place, float] = field(default_factory=dict)

    def add(self, split: Split, sizes: Mapping[str, tuple[str, str, str, float]], seconds_per_unit: float) -> None:
        """A window's split (picoseconds: `seconds_per_unit` 1e-12); `sizes` the places (name -> (..., bytes))."""
        for kind, ps in split.collectives.items():
            key, _ = place_of(kind)
            self.seconds[key] = self.seconds.get(key, 0.0) + ps * seconds_per_unit
        for kind, ps in split.exposed.items():
            key, _ = place_of(kind)
            self.exposed[key] = self.exposed.get(key, 0.0) + ps * seconds_per_unit
        for kind, count in split.events.items():
            key, name = place_of(kind)
            place = sizes.get(name) if name is not None else None
            if place is not None:
                self.bytes[key] = self.bytes.get(key, 0.0) + count * place[3]

    def merge(self, other: PlacedTotals) -> None:
        for mine, theirs in ((self.seconds, other.seconds), (self.exposed, other.exposed), (self.bytes, other.bytes)):
            for key, value in theirs.items():
                if key in mine or len(mine) < MAX_PLACES:
                    mine[key] = mine.get(key, 0.0) + value

    def table(self) -> dict[Place, tuple[float, float, float]]:
        """(seconds, exposed seconds, bytes) per (op, axes, link)."""
        keys = set(self.seconds) | set(self.exposed) | set(self.bytes)
        return {k: (self.seconds.get(k, 0.0), self.exposed.get(k, 0.0), self.bytes.get(k, 0.0)) for k in sorted(keys)}


def splits(
    trace: Trace, windows: list[tuple[int, int]], places: Mapping[str, tuple[str, str, str, float]]
) -> dict[tuple[str, int], tuple[float, list[float], dict[str, float], PlacedTotals]]:
    """Each device's seconds, parts (compute, collective, copy, idle), collective time by op (the sum of its
    instructions' union times) and by place, summed over the windows (trace ns)."""
    out: dict[tuple[str, int], tuple[float, list[float], dict[str, float], PlacedTotals]] = {}
    for t0, t1 in windows:
        for device, s in trace.split(t0, t1).items():
            seconds, parts, collectives, placed = out.setdefault(device, (0.0, [0.0] * 4, {}, PlacedTotals()))
            for i, ps in enumerate((s.compute, s.collective, s.copy, s.idle)):
                parts[i] += ps * PS
            for kind, ps in s.collectives.items():
                op = place_of(kind)[0][0]
                collectives[op] = collectives.get(op, 0.0) + ps * PS
            placed.add(s, places, PS)
            out[device] = (seconds + s.window * PS, parts, collectives, placed)
    return out
