"""A sampled trace's collectives by (op, axes, link): each event attributed to its program's instruction's place.

The analysis thread placed every collective instruction of the tracked programs (jaxmon.training.links: its op, the
mesh axes its groups span, the slowest link they cross, its bytes per device and execution). Instruction names
repeat across programs (a train step and an eval step both have `all-reduce.3`; one function under two meshes
compiles to programs with the same names and other groups), so the places are kept per program (`Catalog`), and a
trace event is looked up by its program and instruction (jaxmon.xla.classify says what the trace tells of each
event's program):

- by program id where the trace's id is the one the analysis read (`ProgramPlaces.program_id`: CPU and GPU, the
  HloModule's unique id): exact;
- else by module name and instruction, where every analysed program of that name that has the instruction agrees on
  its place; where they disagree, the event counts under its op with axes "" and link "unknown", and why
  (`AMBIGUOUS`), never a guess;
- an event whose trace names no program, of an instruction some analysed program has: the same, why `UNNAMED`.

An event of a program not analysed (not tracked, not analysed yet) counts under its opcode's kind with axes "" and
link "unknown", and adds no bytes. The sampler's thread names each event's kind (`Catalog.__call__`:
`op SEP axes SEP link SEP bytes SEP ref`, `ref` one per instruction of a program), so the split keeps each
instruction apart (jaxmon.xla.intervals), and `PlacedTotals.add()` sums a window's split per (op, axes, link): the
time each ran (overlapped with compute or not), its exposed time (no compute running) and the bytes of its events
inside the window (events x the instruction's bytes, nccl-tests' convention). Pure: no JAX.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from jaxmon.xla.classify import opcode
from jaxmon.xla.copies import copy_of
from jaxmon.xla.intervals import Split
from jaxmon.xla.profile import Trace

SEP = "\x1f"
Place = tuple[str, str, str]
UNPLACED_LINK = "unknown"
# Why an event of an analysed instruction is not placed (jaxmon_training_tracking_problems_total{reason="trace_<why>"}).
AMBIGUOUS = "ambiguous"  # analysed programs of its module name disagree on the instruction's place
UNNAMED = "unnamed"  # the trace does not say which program the event is of
# (op, axes, link) series per device at most (as the collective bytes' MAX_PAIRS): a new one past it is not counted.
MAX_PLACES = 256
PS = 1e-12


@dataclass(frozen=True)
class ProgramPlaces:
    """One analysed program: its HLO module name, its program id as the trace names it (None: the platform's trace
    uses another id, e.g. a TPU's fingerprint), and each collective instruction's (op, axes, link, bytes per device
    and execution)."""

    module: str
    program_id: int | None
    places: Mapping[str, tuple[str, str, str, float]]


class Catalog:
    """The analysed programs' collective instructions, looked up by program and instruction (a
    jaxmon.xla.classify.Namer): built once per set of programs, asked once per distinct (module, program,
    instruction) of a trace."""

    def __init__(self, programs: Iterable[ProgramPlaces] = ()) -> None:
        self._by_id: dict[int, dict[str, str]] = {}
        self._by_module: dict[str, list[tuple[bool, dict[str, str]]]] = {}
        self._ops: dict[str, set[str]] = {}  # instruction name -> its ops in any program (for the unnamed)
        for index, program in enumerate(programs):
            kinds = {
                name: SEP.join((op, axes, link, repr(float(size)), f"{index}:{name}"))
                for name, (op, axes, link, size) in program.places.items()
            }
            if program.program_id is not None:
                self._by_id[program.program_id] = kinds
            self._by_module.setdefault(program.module, []).append((program.program_id is not None, kinds))
            for name, (op, *_) in program.places.items():
                self._ops.setdefault(name, set()).add(op)

    def __call__(self, module: str | None, program: int | None, name: str) -> str | None:
        """The kind of instruction `name` of program (`module`, `program`): placed, unplaced with why, or None (not
        an analysed program's collective: classified by its opcode)."""
        if program is not None and program in self._by_id:
            return self._by_id[program].get(name)
        if module is None:
            if program is None and name in self._ops:
                return unplaced(name, self._ops[name], UNNAMED)
            return None
        # With an id the trace gives and no analysed program has, the programs of that name whose id the trace
        # would carry are not it (another program of that name, not analysed): only those without one may be.
        found = {
            kinds[name].rsplit(SEP, 1)[0]: kinds[name]
            for has_id, kinds in self._by_module.get(module, ())
            if name in kinds and (program is None or not has_id)
        }
        if not found:
            return None
        if len(found) == 1:  # one place (op, axes, link, bytes), whichever programs have it
            return next(iter(found.values()))
        return unplaced(name, {place_of(kind)[0][0] for kind in found.values()}, AMBIGUOUS)


def unplaced(name: str, ops: set[str], why: str) -> str:
    """The kind of an analysed instruction's event that cannot be placed: its op (if its programs agree on it, else
    its opcode's), axes "", link unknown, and why."""
    op = next(iter(ops)) if len(ops) == 1 else opcode(name)
    return SEP.join((op, "", UNPLACED_LINK, "", "!" + why))


def place_of(kind: str) -> tuple[Place, float | None, str | None]:
    """(op, axes, link) of a split's collective kind, its instruction's bytes per event (None: not placed) and why
    an analysed instruction's event is not placed (None: it is, or it is no analysed program's)."""
    parts = kind.split(SEP)
    if len(parts) == 5:
        if parts[4].startswith("!"):
            return (parts[0], parts[1], parts[2]), None, parts[4][1:]
        return (parts[0], parts[1], parts[2]), float(parts[3]), None
    return (kind, "", UNPLACED_LINK), None, None


@dataclass
class PlacedTotals:
    """One device's sampled collectives by (op, axes, link): seconds run, exposed seconds, bytes; the events of
    analysed instructions that could not be placed, by why; and the copies by direction (jaxmon.xla.classify's
    COPY_DIRECTIONS): seconds with nothing else running (the `copy` part by direction) and bytes, where the trace
    says them (a GPU's memcpy events)."""

    seconds: dict[Place, float] = field(default_factory=dict)
    exposed: dict[Place, float] = field(default_factory=dict)
    bytes: dict[Place, float] = field(default_factory=dict)
    unplaced: dict[str, int] = field(default_factory=dict)
    copy_seconds: dict[str, float] = field(default_factory=dict)
    copy_bytes: dict[str, float] = field(default_factory=dict)

    def add(self, split: Split, seconds_per_unit: float) -> None:
        """A window's split (picoseconds: `seconds_per_unit` 1e-12), its kinds named by a Catalog."""
        for kind, ps in split.collectives.items():
            key = place_of(kind)[0]
            self.seconds[key] = self.seconds.get(key, 0.0) + ps * seconds_per_unit
        for kind, ps in split.exposed.items():
            key = place_of(kind)[0]
            self.exposed[key] = self.exposed.get(key, 0.0) + ps * seconds_per_unit
        for kind, count in split.events.items():
            key, size, why = place_of(kind)
            if size is not None:
                self.bytes[key] = self.bytes.get(key, 0.0) + count * size
            elif why is not None:
                self.unplaced[why] = self.unplaced.get(why, 0) + count
        for kind, ps in split.copies.items():
            direction = copy_of(kind)[0]
            self.copy_seconds[direction] = self.copy_seconds.get(direction, 0.0) + ps * seconds_per_unit
        for kind, count in split.copy_events.items():
            direction, size = copy_of(kind)
            if size is not None:
                self.copy_bytes[direction] = self.copy_bytes.get(direction, 0.0) + count * size

    def merge(self, other: PlacedTotals) -> None:
        for mine, theirs in ((self.seconds, other.seconds), (self.exposed, other.exposed), (self.bytes, other.bytes)):
            for key, value in theirs.items():
                if key in mine or len(mine) < MAX_PLACES:
                    mine[key] = mine.get(key, 0.0) + value
        for why, count in other.unplaced.items():
            self.unplaced[why] = self.unplaced.get(why, 0) + count
        for direction, value in other.copy_seconds.items():
            self.copy_seconds[direction] = self.copy_seconds.get(direction, 0.0) + value
        for direction, value in other.copy_bytes.items():
            self.copy_bytes[direction] = self.copy_bytes.get(direction, 0.0) + value

    def table(self) -> dict[Place, tuple[float, float, float]]:
        """(seconds, exposed seconds, bytes) per (op, axes, link)."""
        keys = set(self.seconds) | set(self.exposed) | set(self.bytes)
        return {k: (self.seconds.get(k, 0.0), self.exposed.get(k, 0.0), self.bytes.get(k, 0.0)) for k in sorted(keys)}

    def copies(self) -> dict[str, tuple[float, float]]:
        """(seconds, bytes) per copy direction."""
        keys = set(self.copy_seconds) | set(self.copy_bytes)
        return {k: (self.copy_seconds.get(k, 0.0), self.copy_bytes.get(k, 0.0)) for k in sorted(keys)}


def splits(
    trace: Trace, windows: list[tuple[int, int]]
) -> dict[tuple[str, int], tuple[float, list[float], dict[str, float], PlacedTotals]]:
    """Each device's seconds, parts (compute, collective, copy, idle), collective time by op (the sum of its
    instructions' union times) and by place, summed over the steps' windows (trace ns), each edge on the device's
    own completion of a program where the trace holds one (Trace.step_windows)."""
    out: dict[tuple[str, int], tuple[float, list[float], dict[str, float], PlacedTotals]] = {}
    for device, device_windows in sorted(trace.step_windows(windows).items()):
        for t0, t1 in device_windows:
            s = trace.split_ps(device, t0, t1)
            seconds, parts, collectives, placed = out.setdefault(device, (0.0, [0.0] * 4, {}, PlacedTotals()))
            for i, ps in enumerate((s.compute, s.collective, s.copy, s.idle)):
                parts[i] += ps * PS
            for kind, ps in s.collectives.items():
                op = place_of(kind)[0][0]
                collectives[op] = collectives.get(op, 0.0) + ps * PS
            placed.add(s, PS)
            out[device] = (seconds + s.window * PS, parts, collectives, placed)
    return out
