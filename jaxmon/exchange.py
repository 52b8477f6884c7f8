"""Readings one collector offers to others: one explicit, typed mechanism, wired by the composition root.

No collector imports another or searches the snapshot for a type. A collector class declares what its state
offers (`Collector.offers`: channel -> function of its state); `compose.py` registers each running collector's offers
(and constants, such as an embedded workload's own pid) on the runtime's `Exchange`, which every collector receives
when it is built, and a collector that needs a reading calls `exchange.read(CHANNEL)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from jaxmon.snapshot import Snapshot

T = TypeVar("T")


@runtime_checkable
class DutyCycles(Protocol):
    """A device-wide source's duty cycles of this process's JAX devices (NVML, libtpu)."""

    def duty_cycle(self, platform: str, device: int) -> float | None:
        """The device's last duty cycle in 0-1, None when this source does not know the device."""


# A device identity, as a series' device is known to the owner sources: (kind, value), the value as `device_id`
# spells it (UUIDs and PCI bus ids lower-case). What one owner source names (a device plugin's GPU UUID, `nvidiaN`'s
# minor number) is matched to what one collector's series are (the NVML GPU with that UUID or minor number).
DeviceId = tuple[str, str]
GPU_UUID = "uuid"  # a whole GPU's UUID, `gpu-…`
MIG_UUID = "mig"  # a MIG device's UUID, `mig-…` (what a series' `mig_uuid` label names)
GPU_MINOR = "minor"  # a GPU's minor number, N of /dev/nvidiaN
PCI_BUS_ID = "pci_bus_id"  # a GPU's PCI bus id, `00000000:18:00.0`
TPU_DEVICE = "libtpu_device"  # a TPU chip by libtpu's device-id
TPU_NODE = "tpu_node"  # any TPU chip of this node (what the device plugin's chip ids can say: DESIGN.md §13)

# What a series is about, from its labels: (source, platform, device); source `JAX_DEVICE` for the series of this
# process's own JAX devices (memory, probe, their metrics.DEVICE_INFO row), whose `device` is the JAX device id.
SeriesKey = tuple[str, str, str]
JAX_DEVICE = ""
# A collector's series keys -> the identities of the device each is about.
DeviceIdentities = Mapping[SeriesKey, tuple[DeviceId, ...]]


def device_id(kind: str, value: str) -> DeviceId:
    """The identity of kind `kind` (GPU_UUID, ...) with value `value`, spelled as owners and series compare it."""
    return (kind, value.lower())


@dataclass(frozen=True)
class GpuProcesses:
    """The compute processes NVML reports on one GPU: the GPU's `device` label and UUID, and their pids (in NVML's
    PID namespace, the host's)."""

    device: str
    uuid: str
    pids: tuple[int, ...]


# Who owns a device or a process: what the owner sources offer on OWNERS, which the owner transform
# (jaxmon.ownership.owners) writes on series.


@dataclass(frozen=True, order=True)
class Owner:
    """A container that holds a device or runs a process."""

    namespace: str
    pod: str
    container: str
    # What else its source knows of it (a DRA claim: ("claim", "ns/name")): kept for the source's own families,
    # never written on device series.
    extra: tuple[tuple[str, str], ...] = ()


def owner_labels(owners: Iterable[Owner]) -> dict[str, str]:
    """`namespace`, `pod` and `container` of the owners of one device or process, joined; {} for none."""
    found = set(owners)
    if not found:
        return {}
    return {
        "namespace": ",".join(sorted({o.namespace for o in found})),
        "pod": ",".join(sorted({o.pod for o in found})),
        "container": ",".join(sorted({o.container for o in found})),
    }


@dataclass(frozen=True)
class Owners:
    """What one owner source knows (or several, merged): the owners of device identities and of process ids."""

    devices: Mapping[DeviceId, frozenset[Owner]] = field(default_factory=dict)
    pids: Mapping[int, frozenset[Owner]] = field(default_factory=dict)
    # Identities whose owners are candidates, not sharers: they count only where they are one (the rules in
    # jaxmon.ownership.owners).
    sole: frozenset[DeviceId] = frozenset()

    @property
    def empty(self) -> bool:
        """Whether it names no owner at all."""
        return not self.devices and not self.pids

    def of(self, ids: Iterable[DeviceId]) -> frozenset[Owner]:
        """The owners of a device known by the identities `ids` (each it has: UUID, minor number, ...)."""
        found: set[Owner] = set()
        for key in ids:
            owners = self.devices.get(key)
            if owners and (key not in self.sole or len(owners) == 1):
                found |= owners
        return frozenset(found)

    def labels(self, ids: Iterable[DeviceId]) -> dict[str, str]:
        """The owner labels of a device known by `ids`; {} when nobody owns it."""
        return owner_labels(self.of(ids))

    @classmethod
    def merged(cls, many: Iterable[Owners]) -> Owners:
        """Several sources' owners as one: an identity's (or pid's) owners are every source's together."""
        devices: dict[DeviceId, frozenset[Owner]] = {}
        pids: dict[int, frozenset[Owner]] = {}
        sole: frozenset[DeviceId] = frozenset()
        for owners in many:
            for key, found in owners.devices.items():
                devices[key] = devices.get(key, frozenset()) | found
            for pid, found in owners.pids.items():
                pids[pid] = pids.get(pid, frozenset()) | found
            sole |= owners.sole
        return cls(devices, pids, sole)


@dataclass(frozen=True, eq=False)
class Channel(Generic[T]):
    """A kind of reading, typed by what it carries."""

    name: str
    doc: str


DUTY_CYCLES: Channel[DutyCycles] = Channel(
    "duty_cycles", "device-wide duty cycles (NVML, libtpu): the probe's idle gate and busy check"
)
WORKLOAD_PIDS: Channel[Mapping[int, str]] = Channel(
    "workload_pids", "workload name by pid (the spool's reports, an embedded workload itself): NVML's process join"
)

DEVICE_IDENTITIES: Channel[DeviceIdentities] = Channel(
    "device_identities",
    "which device each series of a collector is about (NVML: a GPU's UUID, minor number and PCI bus id, for its "
    "own series and a matched JAX device's; libtpu: its chips): what the owner transform looks owners up by",
)

GPU_PROCESSES: Channel[Sequence[GpuProcesses]] = Channel(
    "gpu_processes", "the pids of the compute processes on each GPU (NVML): whose processes use which GPU"
)

OWNERS: Channel[Owners] = Channel(
    "owners", "who owns each device identity and process id (the kubelet, ...): the owner transform's map"
)


class Exchange:
    """The offers of the running collectors, read from the latest (or a given) snapshot."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot
        self._offers: dict[Channel[Any], list[tuple[str, Callable[[Any], Any]]]] = {}
        self._constants: dict[Channel[Any], list[Any]] = {}

    def offer(self, channel: Channel[T], collector: str, read: Callable[[Any], T | None]) -> None:
        """`collector`'s state offers `read(state)` on `channel` (None: nothing to offer now)."""
        self._offers.setdefault(channel, []).append((collector, read))

    def constant(self, channel: Channel[T], value: T) -> None:
        """A value that is always on `channel` (known when the runtime is built)."""
        self._constants.setdefault(channel, []).append(value)

    def read(self, channel: Channel[T], snap: Snapshot | None = None) -> list[T]:
        """Every value on `channel` now (or in `snap`): collectors' offers in registration order, then constants."""
        snap = self._snapshot() if snap is None else snap
        out: list[T] = []
        for collector, read in self._offers.get(channel, []):
            state = snap.states.get(collector)
            if state is not None:
                value = read(state)
                if value is not None:
                    out.append(value)
        out.extend(self._constants.get(channel, []))
        return out
