"""Readings one collector offers to others: one explicit, typed mechanism, wired by the composition root.

No collector imports another or searches the snapshot for a type. A collector class declares what its state
offers (`Collector.offers`: channel -> function of its state); `app.py` registers each running collector's offers
(and constants, such as an embedded workload's own pid) on the runtime's `Exchange`, which every collector receives
when it is built, and a collector that needs a reading calls `exchange.read(CHANNEL)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from jaxmon.snapshot import Snapshot

T = TypeVar("T")


@runtime_checkable
class DutyCycles(Protocol):
    """A device-wide source's duty cycles of this process's JAX devices (NVML, libtpu)."""

    def duty_cycle(self, platform: str, device: int) -> float | None:
        """The device's last duty cycle in 0-1, None when this source does not know the device."""


@runtime_checkable
class DevicePods(Protocol):
    """The pods holding each accelerator of the node (the kubelet's pod-resources): labels for device-wide series.

    Each method gives `namespace`, `pod` and `container` of the device's holders (several holders' values joined by
    commas), or {} when no pod holds it.
    """

    def gpu(self, uuid: str | None, minor_number: int | None) -> Mapping[str, str]:
        """A whole GPU, by its UUID (`GPU-…`) or its minor number (/dev/nvidiaN)."""

    def mig(self, uuid: str) -> Mapping[str, str]:
        """A MIG device, by its UUID (`MIG-…`)."""

    def tpu(self, device: int) -> Mapping[str, str]:
        """A TPU device, by libtpu's device-id ({} wherever the chip's holder is not certain)."""

    def tpu_host(self) -> Mapping[str, str]:
        """The node's libtpu service itself: the holder of its chips ({} where not certain)."""


@dataclass(frozen=True)
class GpuProcesses:
    """The compute processes NVML reports on one GPU: the GPU's `device` label and UUID, and their pids (in NVML's
    PID namespace, the host's)."""

    device: str
    uuid: str
    pids: tuple[int, ...]


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

DEVICE_PODS: Channel[DevicePods] = Channel(
    "device_pods", "the pods holding each GPU, MIG device and TPU chip (the kubelet): labels of device-wide series"
)

GPU_PROCESSES: Channel[Sequence[GpuProcesses]] = Channel(
    "gpu_processes", "the pids of the compute processes on each GPU (NVML): whose processes use which GPU"
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
