"""Where device readings come from: local JAX devices, replay files, the spool, and the fault-injecting wrapper.

Sources return raw readings (`memory_stats()`-shaped dicts, published documents); collectors derive the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from jaxmon.checkpoints import CheckpointReading
from jaxmon.device_readings import ArrayBytes, BackendStatus, DeviceInfo, ProbeKernel

if TYPE_CHECKING:  # a type alone: the sources load nothing of the tracker
    from jaxmon.training_readings import TrainingReading

# A trace of the training process on demand (/debug/trace): `(directory, steps, seconds)` records `steps` whole steps
# or `seconds` (one of the two) into `directory` and returns it as a gzip tar.
TraceDemand = Callable[[Path, int | None, float | None], bytes]


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
    """A workload process's view of itself (embedded mode, publisher): live arrays, compile counters, and the
    training tracker's reading and traces. The one surface through which the exporter and the publisher reach the
    tracker."""

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

    def checkpoints(self) -> CheckpointReading:
        """The process's last checkpoint (Orbax's saves, jaxmon.checkpointed())."""

    def device_memory_profile(self) -> bytes:
        """The process's live device buffers as a gzipped pprof profile (slow: call off the event loop)."""

    def training(self) -> TrainingReading | None:
        """The training tracker's reading (jaxmon.step()), its sampled traces' split included, None without a
        tracker."""

    @property
    def trace_demand(self) -> TraceDemand | None:
        """Traces of this process's steps on demand (/debug/trace), None without a tracker."""

    def settle(self, timeout: float) -> None:
        """Every step handed by now booked, waiting `timeout` at most: before a last document or scrape."""

    def release(self) -> None:
        """The exporter or publisher that holds this view stopped: it lets go of its share of the tracker (the last
        share stops it)."""

    def training_devices(self, within: float) -> frozenset[tuple[str, int]]:
        """The devices this process's job is training on: all of the process's devices when a step of it ended
        within the last `within` seconds (jaxmon.step()), else none."""
