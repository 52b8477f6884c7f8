"""Which link a collective's groups cross: the slowest one between any two members of any group.

A pure module on plain data (no JAX, no NVML): the caller passes each device's topology descriptor (`DeviceTopology`,
read from JAX's devices and, on GPUs, NVML's topology calls) and a collective's groups as flattened ids, which index
the program's device assignment (jaxmon.xla.hlo). Run once per program on the analysis thread.

The links, fastest first (the device catalog's LINKS, jaxmon.catalog.hardware):
- `local`: CPU devices of one process (one address space: a copy in memory).
- `nvlink`: GPUs of one host, every pair NVLink-connected (NVML's NVLink remote PCI info names the peer).
- `ici`: TPU chips of one slice (same `slice_index`; ICI spans the hosts of a slice).
- `pcie`: GPUs of one host under a common PCIe switch or host bridge (NVML's common ancestor up to
  NVML_TOPOLOGY_HOSTBRIDGE) without NVLink.
- `sys`: GPUs of one host across the CPUs' interconnect (NVML_TOPOLOGY_NODE or NVML_TOPOLOGY_SYSTEM: NUMA nodes).
- `dcn`: TPU chips of different slices (the data-center network between slices).
- `network`: devices of different hosts (GPU) or of different processes (CPU).

`unknown` where the topology cannot be read: a device without a descriptor, TPUs of several processes without
`slice_index`, GPUs of
one host without NVML's topology for a pair, GPUs of different processes whose hosts are not known. Never a guess:
a group is `network` only if some pair is known to cross hosts (no link is slower), else `unknown` if any pair is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxmon.catalog.hardware import DCN, ICI, LINKS, LOCAL, NETWORK, NVLINK, PCIE, SYS, UNKNOWN, nvml_link, slowest
from jaxmon.xla.hlo import HloProgram, MeshLayout, mesh_axes

__all__ = ["DCN", "ICI", "LINKS", "LOCAL", "NETWORK", "NVLINK", "PCIE", "SYS", "UNKNOWN", "nvml_link", "slowest"]

# Why a group's link is unknown (the tracking problems' reason="link_<why>").
NO_DEVICE = "device"  # an id outside the assignment, or a device without a descriptor
NO_ASSIGNMENT = "assignment"  # the program's device order is not known
NO_SLICE = "slice"  # a TPU without slice_index
NO_HOST = "host"  # GPUs of different processes whose hosts are not known
NO_TOPOLOGY = "topology"  # GPUs of one host without NVML's topology for a pair (or a platform jaxmon cannot read)
REASONS = (NO_DEVICE, NO_ASSIGNMENT, NO_SLICE, NO_HOST, NO_TOPOLOGY)


@dataclass(frozen=True)
class DeviceTopology:
    """One device of the job as the link classification needs it: `id` (JAX's device id), `platform` ("cpu", "gpu",
    "tpu"), `process_index`; TPU: `slice_index` (None: not known) and `coords`; GPU: `host` (None: not known; the
    devices of one process share one)."""

    id: int
    platform: str
    process_index: int
    slice_index: int | None = None
    coords: tuple[int, ...] | None = None
    host: str | None = None


def describe(device: Any, host: str, process: int) -> DeviceTopology:
    """The descriptor of a JAX device (`jax.devices()`'s, or anything with its attributes: the replay format's):
    its `id`, `platform`, `process_index`, TPU `slice_index` and `coords` where it has them. `host` is the host of
    this process (`process`, its process_index): a GPU of this process is on it; another process's host is not
    known (a JAX device does not say)."""
    platform = str(device.platform)
    slice_index = getattr(device, "slice_index", None)
    coords = getattr(device, "coords", None)
    process_index = int(device.process_index)
    return DeviceTopology(
        id=int(device.id),
        platform=platform,
        process_index=process_index,
        slice_index=int(slice_index) if isinstance(slice_index, int) and not isinstance(slice_index, bool) else None,
        coords=tuple(int(c) for c in coords) if isinstance(coords, list | tuple) else None,
        host=host if platform == "gpu" and process_index == process else None,
    )


# The link between two GPUs of one host by their JAX device ids (None: NVML does not say, or they are not matched
# to NVML's GPUs with certainty: jaxmon.sources.nvml.match).
GpuPairs = Callable[[int, int], str | None]


def group_link(
    groups: Iterable[Sequence[int]],
    assignment: Sequence[int] | None,
    devices: Mapping[int, DeviceTopology],
    gpu_pairs: GpuPairs | None = None,
) -> tuple[str, str | None]:
    """The slowest link any group's members cross, and None; or (UNKNOWN, why) where a pair's link cannot be read
    and no pair is known to cross the network. `groups` hold flattened ids into `assignment` (device ids in the
    program's order). A group of one device crosses nothing: groups of one only are `local`.

    Linear in the devices for CPU and TPU (a group's processes or slices as a set); pairwise only among the GPUs of
    one host (eight or sixteen)."""
    if assignment is None:
        return UNKNOWN, NO_ASSIGNMENT
    worst = LOCAL
    why: str | None = None
    for group in groups:
        members: list[DeviceTopology] = []
        for i in group:
            device = devices.get(assignment[i]) if 0 <= i < len(assignment) else None
            if device is None:
                why = why or NO_DEVICE
                continue
            members.append(device)
        link, reason = _group(members, gpu_pairs)
        if link == UNKNOWN:
            why = why or reason
        else:
            worst = slowest((worst, link))
        if worst == NETWORK:
            return NETWORK, None  # nothing is slower: an unknown pair cannot change it
    return (UNKNOWN, why) if why is not None else (worst, None)


def _group(members: list[DeviceTopology], gpu_pairs: GpuPairs | None) -> tuple[str, str | None]:
    if len(members) < 2:
        return LOCAL, None
    platforms = {m.platform for m in members}
    platform = platforms.pop() if len(platforms) == 1 else ""
    if platform == "cpu":
        return (LOCAL if len({m.process_index for m in members}) == 1 else NETWORK), None
    if platform == "tpu":
        slices = {m.slice_index for m in members}
        if None in slices:
            # A host's chips are one slice's (ICI joins them): the chips of one process need no slice_index (a
            # single-host TPU VM's devices have none: seen on a v5e chip, jax 0.10.2); across processes, unknown.
            if len({m.process_index for m in members}) == 1:
                return ICI, None
            return UNKNOWN, NO_SLICE
        return (ICI if len(slices) == 1 else DCN), None
    if platform != "gpu":
        return UNKNOWN, NO_TOPOLOGY
    # GPUs: a process is on one host; hosts differ -> network; on one host, pairwise as NVML says.
    hosts = {m.host if m.host is not None else f"process {m.process_index}" for m in members}
    if len(hosts) > 1:
        known = {m.host for m in members if m.host is not None}
        if len(known) > 1:
            return NETWORK, None
        return UNKNOWN, NO_HOST  # processes whose hosts are not known may share one (pcie, nvlink) or not
    if gpu_pairs is None:
        return UNKNOWN, NO_TOPOLOGY
    worst = LOCAL
    for k, a in enumerate(members):
        for b in members[k + 1 :]:
            link = gpu_pairs(a.id, b.id)
            if link not in (NVLINK, PCIE, SYS):
                return UNKNOWN, NO_TOPOLOGY
            worst = slowest((worst, link))
    return worst, None


@dataclass(frozen=True)
class Placed:
    """A program's collectives placed on the mesh and the links: bytes per device and execution by (op, axes, link)
    (axes comma-joined, "" without a mesh); each collective instruction's (op, axes, link) and bytes per
    execution by name (what a sampled trace's events are named by); and the groups whose link is unknown, by why
    (one count per collective instruction)."""

    collective_bytes: dict[tuple[str, str, str], float] = field(default_factory=dict)
    places: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    sizes: dict[str, float] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)


def place(
    program: HloProgram,
    mesh: MeshLayout | None,
    assignment: Sequence[int] | None,
    devices: Mapping[int, DeviceTopology],
    gpu_pairs: GpuPairs | None = None,
) -> Placed:
    """Each collective of `program` (jaxmon.xla.hlo.parse) with its mesh axes and link; the mesh axes and the
    link are read once per spelling of groups (a program shares a few among thousands of collectives)."""
    out = Placed()
    known: dict[int, tuple[str, str, str | None]] = {}
    for c in program.collectives:
        key = id(c.groups)
        found = known.get(key)
        if found is None:
            axes = ",".join(mesh_axes(c.groups, mesh, assignment)) if mesh is not None else ""
            order = assignment if assignment is not None else (mesh.device_ids if mesh is not None else None)
            link, why = group_link(c.groups, order, devices, gpu_pairs)
            found = known[key] = (axes, link, why)
        axes, link, why = found
        out.places[c.name] = (c.op, axes, link)
        out.sizes[c.name] = float(c.bytes)
        if why is not None:
            out.unknown[why] = out.unknown.get(why, 0) + 1
        if c.multiplier and c.bytes:
            k = (c.op, axes, link)
            out.collective_bytes[k] = out.collective_bytes.get(k, 0.0) + float(c.bytes * c.multiplier)
    return out
