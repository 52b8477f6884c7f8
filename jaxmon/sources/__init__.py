"""Where device readings come from: local JAX devices, replay files, the spool, and the fault-injecting wrapper.

Sources return raw readings (`memory_stats()`-shaped dicts, published documents); collectors derive the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from jaxmon.device_readings import ArrayBytes, BackendStatus, DeviceInfo, ProbeKernel

if TYPE_CHECKING:  # a type alone: importing jaxmon.training here would load the tracker in every daemon
    from jaxmon.training.reading import TrainingReading
    from jaxmon.training.tracker import Tracker


class DeviceSource(Protocol):
    """Devices and their stats: this process's JAX devices, or a replay file."""

    name: str
    runs_probes: bool

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """Devices to report, and the backends tried."""

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """One `memory_stats()`-shaped dict, None when unsupported; raises on a device error."""

    def make_probe(self, device: DeviceInfo, size: int) -> ProbeKernel | None:
        """A compiled probe for `device`, or None when the source runs no probes."""


class InProcess(Protocol):
    """A workload process's view of itself (embedded mode, publisher): live arrays and compile counters."""

    process_index: int
    process_count: int

    @property
    def jax_version(self) -> str:
        """The running JAX's version."""

    def live_array_bytes(self) -> dict[tuple[str, int], int]:
        """Bytes of live arrays in device memory per device."""

    def array_bytes(self) -> ArrayBytes:
        """Bytes of live arrays per device by placement (device memory, replicated, host memory), in one pass."""

    def compile_counts(self) -> dict[str, float]:
        """Compile counters since start."""

    def device_memory_profile(self) -> bytes:
        """The process's live device buffers as a gzipped pprof profile (slow: call off the event loop)."""

    @property
    def tracker(self) -> Tracker | None:
        """The training tracker (jaxmon.step()) held for this process's exporter or publisher, None without one."""

    def training(self) -> TrainingReading | None:
        """The training tracker's reading (jaxmon.step()), None without a tracker."""

    def training_devices(self, within: float) -> frozenset[tuple[str, int]]:
        """The devices this process's job is training on: all of the process's devices when a step of it ended
        within the last `within` seconds (jaxmon.step()), else none."""
