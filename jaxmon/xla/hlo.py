"""Communication of one compiled program, read from its optimized HLO text: each collective, its bytes, its groups.

What `jaxmon_training_collective_bytes` counts (the tracker's analysis thread parses each tracked program once): a
pure module on text, so that it is tested on real and literal HLO and runs off the training thread (a large
program's text is megabytes). It imports nothing from JAX; the caller passes `compiled.as_text()` (of
`jax.jit(f).lower(...).compile()`) and, to name mesh axes, the user's mesh as plain data.

What the text holds (XLA's HLO printer; seen on jax 0.10.2's CPU backend, the rest from XLA's sources):

- Computations: a header line at column 0 (`%name (params) -> shape {`, `ENTRY %main ...{`), indented instruction
  lines `%name = shape opcode(operands), attr=..., ...`, and `}`. The text also holds sections that are not
  computations (`FileNames`, `StackFrames`, ...), which are skipped.
- A collective is one of COLLECTIVES; an async backend splits it into `<op>-start` / `<op>-done` (counted once, at
  the start). A tuple-shaped collective combines several buffers (`(f32[], f32[64,256]{1,0}) all-reduce(...)`).
- Sizes by nccl-tests' convention, per device and execution: all-reduce, all-to-all, collective-permute,
  collective-broadcast: the operand buffer, which is also the result's shape; all-gather: the gathered result;
  reduce-scatter: the input, i.e. the result times the group size (the printed operands carry no shapes);
  ragged-all-to-all: its output buffer (the sizes sent are runtime data: an upper bound). An async start's shape
  holds its operands (element 0) and results (element 1), except all-reduce-start, whose shape is its result.
- Groups (`replica_groups=`) in every spelling XLA's printers write (xla/hlo/ir/replica_group.cc, mesh_and_axis.cc,
  tile_assignment.cc): explicit `{{0,1},{2,3}}` (`{}`: everyone); iota `[4,2]<=[2,4]T(1,0)` (the iota of the
  bracketed reshape dims, transposed, read as [groups, size]; an older printer put `devices=` in front); and mesh
  axes `mesh['axis_0'=4,'axis_1'=2] {'axis_1'}` (the compiler's own mesh over the same ids; the groups are the
  devices that differ only along the listed axes, in the listed order; names quoted or bare; axes as sub-axes
  `'axis_0':(1)2`; no axis: each device alone; `maximal_mesh[device_id=5] {}`: that device), with the mesh's device
  ids where they are not 0..n-1 in order, `, device_ids=(...)`, as a TileAssignment prints its array: an iota of
  reshape dims transposed, `[4,2]T(1,0)` (what optax's clip_by_global_norm compiles to on a (data, model) mesh),
  the ids `0,2,4,6,1,3,5,7`, or the full `[2,4]<=[4,2]T(1,0)` / `[2,4]0,2,4,...`. A spelling none of these
  reads is an error, never read as everyone. collective-permute has `source_target_pairs={{0,1},{1,2}}` instead;
  each pair is a group.
- What the ids mean follows XLA's CollectiveOpGroupMode: without `channel_id` they are replica ids; with one, they
  are partition ids (all-to-all, collective-permute, ...), replica ids over all partitions (all-reduce, all-gather,
  reduce-scatter without `use_global_device_ids`), or flattened ids `replica * num_partitions + partition`
  (`use_global_device_ids=true`, what JAX's SPMD partitioner emits). This module turns every spelling into flattened
  ids, which index the program's device assignment (replica-major): for a program JAX compiled under a `Mesh`, id
  i is the i-th device of the program's device assignment, i.e. of the mesh in its own order, NOT the device whose
  `.id` is i (checked: a mesh of permuted devices compiles to the same groups).
- Loops: a `while` names its `body=` and `condition=` computations; `backend_config={..."known_trip_count":{"n":"6"}}`
  says how often the body runs. A collective in the body runs that many times per execution (nested loops
  multiply; a computation called from several places adds up). Also followed: `call` (`to_apply=`), `fusion` and
  the generic `async-start` (`calls=`), and `conditional` (`branch_computations=`, or `true_computation=` and
  `false_computation=`): only one branch runs, so the summary counts the branch that moves the most bytes (an upper
  bound), and every collective there is marked `conditional`. Not followed: the `to_apply` of reductions
  (all-reduce's own adder, reduce, map, sort, scatter): they hold no collectives and run per element.

Linear time: one regex per line, and the work per collective is bounded by its own text; expanded groups are cached
by their spelling (thousands of collectives share a few). The spellings of shapes and groups are read in
`jaxmon.xla.hlo_groups`; this module reads the structure (computations, calls, loops) and maps to mesh axes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from jaxmon.xla.hlo_groups import GroupReader, HloParseError, collective_bytes

__all__ = ["COLLECTIVES", "Collective", "HloParseError", "HloProgram", "MeshLayout", "mesh_axes", "parse", "summarize"]

# The collective opcodes, as HLO spells them.
COLLECTIVES = frozenset(
    {
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "all-to-all",
        "ragged-all-to-all",
        "collective-permute",
        "collective-broadcast",
    }
)
# Calling constructs whose callees run as part of the caller (see the module docstring for what is not followed).
_CALLERS = frozenset({"while", "call", "conditional", "fusion", "async-start"})


@dataclass(frozen=True)
class Collective:
    """One collective instruction of a program.

    `bytes` is per device and per execution of the instruction (nccl-tests' convention, see the module docstring);
    `multiplier` how many times it runs per execution of the program (0: in a branch of a conditional that the
    summary does not count). `groups` are flattened device ids (indices into the program's device assignment);
    `group_size` the devices in each group (2 for the pairs of a collective-permute). `unknown_trips`: it sits in a
    `while` without a known trip count, counted once per run of that loop (a lower bound).
    """

    op: str
    name: str
    computation: str
    bytes: int
    groups: tuple[tuple[int, ...], ...]
    group_size: int
    multiplier: int = 1
    asynchronous: bool = False
    conditional: bool = False
    unknown_trips: bool = False


@dataclass(frozen=True)
class HloProgram:
    """The collectives of one compiled program, with the module's replica and partition counts."""

    name: str
    replica_count: int
    num_partitions: int
    collectives: tuple[Collective, ...]


@dataclass(frozen=True)
class MeshLayout:
    """The user's mesh as plain data: `jax.sharding.Mesh(devices, axis_names)` gives
    `MeshLayout(mesh.axis_names, mesh.devices.shape, tuple(d.id for d in mesh.devices.flat))`."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    device_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.axis_names) != len(self.shape):
            raise ValueError(f"mesh has {len(self.axis_names)} axis names for a shape of {len(self.shape)} dims")
        if math.prod(self.shape) != len(self.device_ids):
            raise ValueError(
                f"mesh shape {self.shape} holds {math.prod(self.shape)} devices, not {len(self.device_ids)}"
            )
        if len(set(self.device_ids)) != len(self.device_ids):
            raise ValueError("mesh device ids repeat")


# ---------------------------------------------------------------------------------------------------------- parsing

_HEADER = re.compile(r"(ENTRY\s+)?%?([A-Za-z_][\w.\-]*)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\(")
_MODULE = re.compile(r"HloModule\s+([^\s,]+)")
_REPLICA_COUNT = re.compile(r"\breplica_count=(\d+)")
_NUM_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")
_NAME = r"%?([\w.\-]+)"
_BODY = re.compile(r"\bbody=" + _NAME)
_CONDITION = re.compile(r"\bcondition=" + _NAME)
_TO_APPLY = re.compile(r"\bto_apply=" + _NAME)
_CALLS = re.compile(r"\bcalls=(?:\{([^}]*)\}|" + _NAME + ")")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_TRUE_FALSE = re.compile(r"\b(?:true|false)_computation=" + _NAME)
_TRIP_COUNT = re.compile(r'"?known_trip_count"?\s*[:=]\s*\{\s*"?n"?\s*[:=]\s*"?(\d+)')


@dataclass
class _Computation:
    collectives: list[Collective] = field(default_factory=list)
    # (callee, factor, trips known); a conditional's branches as one entry with a tuple of callees.
    calls: list[tuple[str, int, bool]] = field(default_factory=list)
    branches: list[tuple[str, ...]] = field(default_factory=list)


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip().lstrip("%") for n in text.split(",") if n.strip())


class _Parser:
    def __init__(self) -> None:
        self.groups = GroupReader()

    def parse(self, text: str) -> HloProgram:
        name = ""
        computations: dict[str, _Computation] = {}
        entry: str | None = None
        current: _Computation | None = None
        current_name = ""
        for line in text.splitlines():
            if not line:
                continue
            if line[0] not in " \t":
                if line.startswith("HloModule"):
                    m = _MODULE.match(line)
                    name = m.group(1) if m else ""
                    r = _REPLICA_COUNT.search(line)
                    p = _NUM_PARTITIONS.search(line)
                    self.groups = GroupReader(int(r.group(1)) if r else 1, int(p.group(1)) if p else 1)
                    continue
                if line.startswith("}"):
                    current = None
                    continue
                h = _HEADER.match(line)
                if h is not None:
                    current_name = h.group(2)
                    current = computations.setdefault(current_name, _Computation())
                    if h.group(1):
                        entry = current_name
                continue
            if current is None:
                continue
            m = _INSTRUCTION.match(line)
            if m is None:
                continue
            opcode = m.group(3)
            if opcode in _CALLERS:
                self._calls(opcode, line, current)
                continue
            start = opcode.endswith("-start")
            op = opcode.removesuffix("-start") if start else opcode
            if op not in COLLECTIVES:
                continue  # -done, -update, and everything else
            groups = self.groups.read(op, line)
            size = len(groups[0]) if groups else 0
            current.collectives.append(
                Collective(
                    op=op,
                    name=m.group(1),
                    computation=current_name,
                    bytes=collective_bytes(op, m.group(2), size, start),
                    groups=groups,
                    group_size=size,
                    asynchronous=start,
                )
            )
        if entry is None:
            raise HloParseError("no ENTRY computation in the HLO text")
        return HloProgram(name, self.groups.replicas, self.groups.partitions, _resolve(computations, entry))

    @staticmethod
    def _calls(opcode: str, line: str, current: _Computation) -> None:
        if opcode == "while":
            body, cond = _BODY.search(line), _CONDITION.search(line)
            trips = _TRIP_COUNT.search(line)
            n = int(trips.group(1)) if trips else 1
            if body:
                current.calls.append((body.group(1), n, trips is not None))
            if cond:
                current.calls.append((cond.group(1), n + 1, trips is not None))
        elif opcode == "call":
            to_apply = _TO_APPLY.search(line)
            if to_apply:
                current.calls.append((to_apply.group(1), 1, True))
        elif opcode == "conditional":
            branches = _BRANCHES.search(line)
            names = _names(branches.group(1)) if branches else tuple(_TRUE_FALSE.findall(line))
            if names:
                current.branches.append(names)
        else:  # fusion, async-start
            calls = _CALLS.search(line)
            if calls:
                for name in _names(calls.group(1)) if calls.group(1) is not None else (calls.group(2),):
                    current.calls.append((name, 1, True))


def _resolve(computations: Mapping[str, _Computation], entry: str) -> tuple[Collective, ...]:
    """Every collective reachable from the entry, with how many times it runs per execution."""

    def callees(c: _Computation) -> Iterable[str]:
        yield from (callee for callee, _, _ in c.calls)
        for branches in c.branches:
            yield from branches

    for c in computations.values():
        for callee in callees(c):
            if callee not in computations:
                raise HloParseError(f"computation {callee!r} is called but not defined")
    # Post-order from the entry (iterative: no recursion limit on deep nesting); callees before callers.
    order: list[str] = []
    seen = {entry}
    stack: list[tuple[str, Iterator[str]]] = [(entry, iter(list(callees(computations[entry]))))]
    while stack:
        node, it = stack[-1]
        child = next(it, None)
        if child is None:
            order.append(node)
            stack.pop()
        elif child not in seen:
            seen.add(child)
            stack.append((child, iter(list(callees(computations[child])))))
    # Bytes per execution of each computation, its callees included (the heaviest branch of each conditional).
    total: dict[str, int] = {}
    for node in order:
        c = computations[node]
        t = sum(x.bytes for x in c.collectives)
        t += sum(factor * total[callee] for callee, factor, _ in c.calls)
        t += sum(max(total[b] for b in branches) for branches in c.branches)
        total[node] = t
    # Runs per program execution, callers before callees; flags carried down.
    runs = dict.fromkeys(order, 0)
    runs[entry] = 1
    unknown = dict.fromkeys(order, False)
    conditional = dict.fromkeys(order, False)
    for node in reversed(order):
        c = computations[node]
        for callee, factor, known in c.calls:
            runs[callee] += runs[node] * factor
            unknown[callee] = unknown[callee] or unknown[node] or not known
            conditional[callee] = conditional[callee] or conditional[node]
        for branches in c.branches:
            heaviest = max(branches, key=lambda b: total[b])
            runs[heaviest] += runs[node]
            for b in branches:
                unknown[b] = unknown[b] or unknown[node]
                conditional[b] = True
    out: list[Collective] = []
    for node in reversed(order):
        for x in computations[node].collectives:
            out.append(
                Collective(
                    op=x.op,
                    name=x.name,
                    computation=x.computation,
                    bytes=x.bytes,
                    groups=x.groups,
                    group_size=x.group_size,
                    multiplier=runs[node],
                    asynchronous=x.asynchronous,
                    conditional=conditional[node],
                    unknown_trips=unknown[node],
                )
            )
    return tuple(out)


def parse(text: str) -> HloProgram:
    """The collectives of the optimized HLO text of one compiled program (`Compiled.as_text()`)."""
    return _Parser().parse(text)


# ---------------------------------------------------------------------------------------------------------- mesh axes


def mesh_axes(
    groups: Iterable[Sequence[int]], mesh: MeshLayout, device_assignment: Sequence[int] | None = None
) -> tuple[str, ...]:
    """The user's mesh axes a collective's groups span, in the mesh's order: the axes along which the members of a
    group differ (they agree along the others by construction). `()` when no group spans an axis or an id cannot be
    placed on the mesh.

    `groups` hold flattened ids, which index the program's device assignment: pass it as `device_assignment`
    (device ids in the program's order, e.g. `[d.id for d in sharding._device_assignment]`). Without it, id i is
    taken to be the i-th device of the mesh in its own order, which is what JAX compiles a program under that mesh
    to.
    """
    position = {device: i for i, device in enumerate(mesh.device_ids)}
    strides = [math.prod(mesh.shape[k + 1 :]) for k in range(len(mesh.shape))]
    spanned = [False] * len(mesh.shape)
    for group in groups:
        coords: list[tuple[int, ...]] = []
        for i in group:
            if device_assignment is not None:
                if not 0 <= i < len(device_assignment):
                    return ()
                flat = position.get(device_assignment[i])
            else:
                flat = i if 0 <= i < len(mesh.device_ids) else None
            if flat is None:
                return ()
            coords.append(tuple((flat // s) % n for s, n in zip(strides, mesh.shape, strict=True)))
        for k in range(len(mesh.shape)):
            if not spanned[k] and len({c[k] for c in coords}) > 1:
                spanned[k] = True
    return tuple(name for name, s in zip(mesh.axis_names, spanned, strict=True) if s)


def summarize(
    program: HloProgram, mesh: MeshLayout | None = None, device_assignment: Sequence[int] | None = None
) -> dict[tuple[str, tuple[str, ...]], int]:
    """Bytes per device and per execution of the program, by (op, mesh axes): each collective's bytes times the
    times it runs. Axes are `()` without a mesh or where the groups do not map onto it."""
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    axes_of: dict[int, tuple[str, ...]] = {}
    for c in program.collectives:
        if not c.multiplier or not c.bytes:
            continue
        key = id(c.groups)  # groups are shared by spelling: map each once
        axes = axes_of.get(key)
        if axes is None:
            axes = mesh_axes(c.groups, mesh, device_assignment) if mesh is not None else ()
            axes_of[key] = axes
        out[(c.op, axes)] = out.get((c.op, axes), 0) + c.bytes * c.multiplier
    return out
