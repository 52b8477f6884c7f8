"""What each event of a profile is: compute, a collective (and which kind), or a copy, on which local device.

The layouts, per platform (CPU seen on jax 0.10.2; GPU from XLA's CUPTI collector and XProf's sources; TPU from
XProf's sources and the line and op names of its TPU test trace):

- CPU: plane `/host:CPU`, a line per thread. Each XLA op is an event named by its HLO instruction, with stats
  `hlo_op`, `hlo_module`, `program_id`, `run_id` and `device_ordinal`: the device comes from that stat, not from
  the plane or the thread (one thread runs several devices' programs). A collective's event spans its whole
  rendezvous: the `Rendezvous`, `Wait: ...` and `Wait for rendezvous callback` events nested in it have no `hlo_op`
  and are ignored, so the interval is the op's, waiting for the slowest participant included (as an NCCL kernel's
  is on a GPU). `end: <op>` markers and every other host event carry no `hlo_op` and are ignored.
- GPU: planes `/device:GPU:N` (N the local device ordinal), a line per CUDA stream named `Stream #<id>`, with the
  kinds of its events in parentheses (`Stream #13(Kernel,MemcpyH2D)`). Only those lines are read: `XLA Ops`,
  `XLA Modules`, `Steps` and the other derived lines repeat the streams' time, and `CUPTI overhead` is the
  profiler's. A kernel is a collective when its name holds "nccl" (XProf's rule) or its `hlo_op` stat names a
  collective (XLA's own collective kernels); `Memcpy*` events (CUPTI's `MemcpyH2D`, `MemcpyD2H`, `MemcpyD2D`,
  `MemcpyP2P`, `MemcpyOther`) and events with a `memcpy_details` stat are copies, by direction (`copy_kind`:
  the event's name, else the details' `kind_src`/`kind_dst`) with their bytes (the details' `size:`, `num_bytes:` in
  older CUPTI collectors); every other kernel (and
  `Memset`) is compute.
- TPU: planes `/device:TPU:N`; the `XLA Ops` line holds the TensorCore's ops, nested (a `while`, `call`,
  `conditional` or megacore fusion holds its body's ops: the innermost op owns each instant), and `Async XLA Ops`
  the asynchronous ops in flight, from start to done (they overlap one another: that line is not un-nested); both
  are read. An op is classified by its `hlo_category` stat (on the event or
  its metadata) and its name: XProf's collective categories (`all-reduce`, `all-gather fusion`, `megacore
  fusion`, ...) and collective opcodes are collectives; `copy-start`, `copy-done`, `async-copy`, `infeed`,
  `outfeed` and the host send/recv categories are transfers between host and device, i.e. copies; the rest is
  compute (an HLO `copy` on one device included).

Each op event belongs to a program (module): CPU and GPU op events carry `hlo_module` and `program_id` stats (XLA's
annotations: the id is the HloModule's unique id, `HloModuleProto.id`: seen on CPU devices, jax 0.10.2); a TPU op's
event metadata carries `program_id` (a fingerprint, not the module's id: seen on a v5e chip), and the plane's `XLA
Modules` line names each program as `name(program_id)` over the span it ran. An op without those stats belongs to
the `XLA Modules` event its start falls in. The caller's names (`Namer`) are asked with the module, the program id
and the instruction, so that instructions of the same name in two programs are told apart.

HLO ops are named by instruction (`all-reduce.3`, `all-gather-start.1`, `fusion.12`; a TPU op's event is named by
its whole HLO text, `%fusion.9 = bf16[...] fusion(...)`, whose instruction is the name before ` = `); the opcode is
the name up to
its first dot, less `-start`/`-done`, except for the collectives a shard_map or pmap body writes, which keep the JAX
primitive's name (`psum.7` is an all-reduce); the caller can name every collective instruction from the compiled
HLO (`jaxmon.xla.hlo`), which no naming convention can miss. A GPU kernel implementing several ops has them
joined by `::`.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Mapping

from jaxmon.xla.copies import copy_kind
from jaxmon.xla.hlo import COLLECTIVES
from jaxmon.xla.intervals import COLLECTIVE, COMPUTE, COPY, Segment, innermost
from jaxmon.xla.xspace import Plane, XSpace

__all__ = ["COLLECTIVE_OPS", "Device", "Namer", "Run", "collective_kind", "device_segments"]

# (platform, local device ordinal)
Device = tuple[str, int]
# A program's run on a device: its start and end (ps, the trace's clock).
Run = tuple[int, int]
# The caller's names for the traced programs' instructions: (module name, program id, instruction name), the first two
# None where the trace does not say, -> the kind its events are classified as (a collective), or None: not an
# instruction the caller knows (classified by its opcode). A Mapping (instruction name -> kind) ignores the program.
Namer = Callable[[str | None, int | None, str], str | None]
Known = Mapping[str, str] | Namer

# HLO's collective opcodes and the point-to-point send/recv.
COLLECTIVE_OPS = COLLECTIVES | {"send", "recv"}
_COPY_OPS = frozenset({"copy-start", "copy-done", "infeed", "outfeed"})
# XProf's hlo_category values (tsl xla_op_utils.h, xprof signal_provider.h IsCollective) mapped to a kind.
_COLLECTIVE_CATEGORIES = {
    "all-reduce fusion": "all-reduce",
    "all-gather fusion": "all-gather",
    "all-reduce-scatter fusion": "reduce-scatter",
    "megacore fusion": "other",
}
_COPY_CATEGORIES = frozenset({"copy-start", "copy-done", "async-copy", "host send", "host send-done", "host recv",
                              "host recv-done", "infeed", "outfeed"})  # fmt: skip
# NCCL kernel names (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`, `ncclKernel_SendRecv`): the kind when no hlo_op
# says it. NCCL's SendRecv serves both all-to-all and collective-permute.
_NCCL_KINDS = (
    ("allreduce", "all-reduce"),
    ("allgather", "all-gather"),
    ("reducescatter", "reduce-scatter"),
    ("alltoall", "all-to-all"),
    ("broadcast", "collective-broadcast"),
    ("sendrecv", "send-recv"),
    ("send", "send-recv"),
    ("recv", "send-recv"),
)
# JAX's collective primitives by name: XLA keeps the name of the primitive a shard_map or pmap body calls as the
# instruction's (`psum.7 = f32[...] all-reduce(...)`, `ppermute.3`, `reduce_scatter.7` for psum_scatter; seen on
# jax 0.10.2), where the SPMD partitioner's own collectives are named by opcode (`all-reduce.1`).
_JAX_PRIMITIVES = {
    "psum": "all-reduce",
    "psum_invariant": "all-reduce",  # a shard_map's psum with check_vma (jax 0.10.2: `psum_invariant.14`)
    "pmax": "all-reduce",
    "pmin": "all-reduce",
    "all_gather": "all-gather",
    "all_gather_invariant": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "psum_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "ragged_all_to_all": "ragged-all-to-all",
    "ppermute": "collective-permute",
}
_DEVICE_PLANE = re.compile(r"/device:(GPU|TPU):(\d+)$")
_MODULE_EVENT = re.compile(r"^(.*)\((\d+)\)$")
_NONE: Mapping[str, str] = {}


def namer(known: Known) -> Namer:
    """`known` as a Namer: a Mapping by instruction name alone."""
    if isinstance(known, Mapping):
        get = known.get
        return lambda module, program, name: get(name)
    return known


def instruction(event_name: str) -> str:
    """The instruction an op event is named by: `%fusion.9 = bf16[...] fusion(...)` (a TPU's) -> `fusion.9`."""
    name = event_name.split(" = ", 1)[0] if " = " in event_name else event_name
    return name.lstrip("%")


def opcode(name: str) -> str:
    """The HLO opcode an instruction name starts with: `%all-gather-start.2` -> `all-gather`."""
    base = name.lstrip("%").split(".", 1)[0]
    for suffix in ("-start", "-done", "-update"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def collective_kind(
    hlo_op: str, known: Known = _NONE, module: str | None = None, program: int | None = None
) -> str | None:
    """The collective kind of an `hlo_op` stat or op name (several joined by `::`), or None if none is one: the
    kind `known` gives the instruction of program (`module`, `program`) (read from the compiled program's HLO),
    else its opcode's, else that of the JAX primitive it is named after."""
    names = namer(known)
    for name in hlo_op.split("::"):
        name = name.lstrip("%")
        kind = names(module, program, name)
        if kind is not None:
            return kind
        op = opcode(name)
        if op in COLLECTIVE_OPS:
            return op
        kind = _JAX_PRIMITIVES.get(op)
        if kind is not None:
            return kind
    return None


def _nccl_kind(kernel: str) -> str:
    flat = kernel.lower().replace("_", "")
    return next((kind for key, kind in _NCCL_KINDS if key in flat), "other")


def classify_gpu(
    name: str,
    hlo_op: str,
    memcpy: bool,
    known: Known = _NONE,
    module: str | None = None,
    program: int | None = None,
    details: str = "",
) -> tuple[int, str]:
    kind = collective_kind(hlo_op, known, module, program) if hlo_op else None
    if kind is not None:
        return COLLECTIVE, kind
    if "nccl" in name.lower():
        return COLLECTIVE, _nccl_kind(name)
    if memcpy or name.startswith("Memcpy"):
        return COPY, copy_kind(name, details)
    return COMPUTE, ""


def classify_hlo(
    name: str, category: str = "", known: Known = _NONE, module: str | None = None, program: int | None = None
) -> tuple[int, str]:
    """A CPU or TPU op by its instruction name and (TPU) its hlo_category."""
    name = instruction(name)
    kind = collective_kind(name, known, module, program)
    if kind is not None:
        return COLLECTIVE, kind
    if name.split(".", 1)[0] in _COPY_OPS or category in _COPY_CATEGORIES:
        return COPY, ""
    if category in _COLLECTIVE_CATEGORIES:
        return COLLECTIVE, _COLLECTIVE_CATEGORIES[category]
    kind = collective_kind(category) if category else None
    if kind is not None:
        return COLLECTIVE, kind
    return COMPUTE, ""


def _stat_ids(plane: Plane, *names: str) -> list[int | None]:
    by_name = {n: i for i, n in plane.stat_names.items()}
    return [by_name.get(n) for n in names]


def _wanted(*ids: int | None) -> frozenset[int]:
    return frozenset(i for i in ids if i is not None)


def _program(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Modules:
    """A device plane's programs from its `XLA Modules` line: each run's span with its module name and program id
    (`jit_step(12190760917235803885)`), and the names by program id."""

    def __init__(self, plane: Plane, modules: set[str]) -> None:
        spans: list[tuple[int, int, str, int | None]] = []
        for line in plane.lines:
            if line.name == "XLA Modules":
                for e in line.iter_events(()):
                    name, program = _module_event(plane.event_names.get(e.metadata_id, ""))
                    spans.append((e.start_ps, e.start_ps + e.duration_ps, name, program))
        spans.sort()
        self._spans = spans
        self._starts = [s[0] for s in spans]
        self.runs = [(s[0], s[1]) for s in spans]  # each run's span: the device's own start and end of a program
        self.names = {program: name for _, _, name, program in spans if program is not None}
        modules.update(name for _, _, name, _ in spans)

    def at(self, t: int) -> tuple[str | None, int | None]:
        """The module and program id of the run whose span holds instant `t` (None, None: none does)."""
        i = bisect_right(self._starts, t) - 1
        if i >= 0 and t < self._spans[i][1]:
            return self._spans[i][2] or None, self._spans[i][3]
        return None, None

    def of(self, module: str | None, program: int | None, t: int) -> tuple[str | None, int | None]:
        """An op's program: what its stats say, the rest from the module line (by id, else by time)."""
        if module is None and program is not None:
            module = self.names.get(program)
        if module is None and program is None:
            return self.at(t)
        return module, program


def _gpu(plane: Plane, modules: set[str], known: Known) -> tuple[list[Segment], list[Run]]:
    hlo_op_id, module_id, program_id, memcpy_id = _stat_ids(plane, "hlo_op", "hlo_module", "program_id",
                                                            "memcpy_details")  # fmt: skip
    wanted = _wanted(hlo_op_id, module_id, program_id, memcpy_id)
    names = plane.event_names
    runs = _Modules(plane, modules)
    cache: dict[tuple[int, str, str | None, str | None, int | None], tuple[int, str]] = {}
    out: list[Segment] = []
    for line in plane.lines:
        if not line.name.startswith("Stream #"):
            continue
        events: list[Segment] = []
        for e in line.iter_events(wanted):
            stats = e.stats
            hlo_op = str(stats.get(hlo_op_id, "")) if hlo_op_id is not None else ""
            module: str | None = None
            program: int | None = None
            if hlo_op:
                module = str(stats[module_id]) if module_id is not None and module_id in stats else None
                program = _program(stats.get(program_id)) if program_id is not None else None
                module, program = runs.of(module, program, e.start_ps)
                if module is not None:
                    modules.add(module)
            details = str(stats[memcpy_id]) if memcpy_id is not None and memcpy_id in stats else None
            key = (e.metadata_id, hlo_op, details, module, program)
            found = cache.get(key)
            if found is None:
                found = cache[key] = classify_gpu(
                    names.get(e.metadata_id, ""), hlo_op, details is not None, known, module, program, details or ""
                )
            events.append((e.start_ps, e.start_ps + e.duration_ps, found[0], found[1]))
        out.extend(innermost(events))
    return out, runs.runs


def _tpu(plane: Plane, modules: set[str], known: Known) -> tuple[list[Segment], list[Run]]:
    category_id, program_id = _stat_ids(plane, "hlo_category", "program_id")
    wanted = _wanted(category_id, program_id)
    names = plane.event_names
    runs = _Modules(plane, modules)
    out: list[Segment] = []
    cache: dict[tuple[int, str, str | None, int | None], tuple[int, str]] = {}
    for line in plane.lines:
        if line.name not in ("XLA Ops", "Async XLA Ops"):
            continue
        events: list[Segment] = []
        for e in line.iter_events(wanted):
            meta = plane.event_stats.get(e.metadata_id, {})
            category = e.stats.get(category_id, "") if category_id is not None else ""
            if not category:
                category = meta.get("hlo_category", "")
            program = _program(e.stats.get(program_id)) if program_id is not None else None
            if program is None:
                program = _program(meta.get("program_id"))
            module, program = runs.of(None, program, e.start_ps)
            key = (e.metadata_id, str(category), module, program)
            found = cache.get(key)
            if found is None:
                found = cache[key] = classify_hlo(names.get(e.metadata_id, ""), key[1], known, module, program)
            events.append((e.start_ps, e.start_ps + e.duration_ps, found[0], found[1]))
        # Async ops in flight overlap one another without nesting: their line is taken as it is.
        out.extend(events if line.name == "Async XLA Ops" else innermost(events))
    return out, runs.runs


def _cpu(plane: Plane, modules: set[str], known: Known) -> tuple[dict[Device, list[Segment]], dict[Device, list[Run]]]:
    hlo_op_id, module_id, program_id, ordinal_id, run_id = _stat_ids(plane, "hlo_op", "hlo_module", "program_id",
                                                                     "device_ordinal", "run_id")  # fmt: skip
    out: dict[Device, list[Segment]] = defaultdict(list)
    if hlo_op_id is None or ordinal_id is None:
        return out, {}
    cache: dict[tuple[str, str | None, int | None], tuple[int, str]] = {}
    wanted = _wanted(hlo_op_id, module_id, program_id, ordinal_id, run_id)
    runs: dict[tuple[int, object], Run] = {}  # (ordinal, run id): its first op's start, its last op's end
    for line in plane.lines:
        per_device: dict[int, list[Segment]] = defaultdict(list)
        for e in line.iter_events(wanted):
            stats = e.stats
            op = stats.get(hlo_op_id)
            ordinal = stats.get(ordinal_id)
            if not isinstance(op, str) or not isinstance(ordinal, int):
                continue
            module = str(stats[module_id]) if module_id is not None and module_id in stats else None
            program = _program(stats.get(program_id)) if program_id is not None else None
            key = (op, module, program)
            found = cache.get(key)
            if found is None:
                found = cache[key] = classify_hlo(op, "", known, module, program)
                if module is not None:
                    modules.add(module)
            start, end = e.start_ps, e.start_ps + e.duration_ps
            per_device[ordinal].append((start, end, found[0], found[1]))
            if run_id is not None and (run := stats.get(run_id)) is not None:
                first, last = runs.get((ordinal, run), (start, end))
                runs[(ordinal, run)] = (min(first, start), max(last, end))
        for ordinal, events in per_device.items():
            out[("cpu", ordinal)].extend(innermost(events))
    spans: dict[Device, list[Run]] = defaultdict(list)
    for (ordinal, _), span in runs.items():
        spans[("cpu", ordinal)].append(span)
    return out, dict(spans)


def _module_event(event_name: str) -> tuple[str, int | None]:
    """An `XLA Modules` event's module and program id: `jit_step(12190760917235803885)` -> ("jit_step", 1219...)."""
    m = _MODULE_EVENT.match(event_name)
    return (m.group(1), int(m.group(2))) if m else (event_name, None)


def device_segments(
    space: XSpace, collectives: Known = _NONE
) -> tuple[dict[Device, list[Segment]], set[str], dict[Device, list[Run]]]:
    """Each local device's activity as segments (disjoint within each stream or thread, overlapping across them),
    the names of the HLO modules seen, and each device's program runs (ps: a TPU's or GPU's `XLA Modules` spans, a
    CPU device's ops of each `run_id`, first start to last end). Accelerator planes when there are any; else the CPU
    devices' ops on the host plane (on a GPU or TPU host the host plane's events are the launches, not device
    time). `collectives`
    names the collective instructions of the programs (a Namer, or instruction name -> kind), as the compiled HLO
    gives them: without it, a collective is recognised by its opcode or JAX primitive name only."""
    modules: set[str] = set()
    out: dict[Device, list[Segment]] = {}
    runs: dict[Device, list[Run]] = {}
    for plane in space.planes:
        m = _DEVICE_PLANE.match(plane.name)
        if m is None:
            continue
        device = ("gpu" if m.group(1) == "GPU" else "tpu", int(m.group(2)))
        out[device], runs[device] = (_gpu if m.group(1) == "GPU" else _tpu)(plane, modules, collectives)
    if not out:
        host = space.plane("/host:CPU")
        if host is not None:
            segments, runs = _cpu(host, modules, collectives)
            out.update(segments)
    modules.discard("")
    return out, modules, runs
