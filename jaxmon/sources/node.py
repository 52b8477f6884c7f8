"""Node mode's source: no JAX devices at all, so that a daemon that only reads device-wide sources (NVML, libtpu,
the kubelet) never imports JAX, holds no CUDA context and no device memory of its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxmon.device_readings import BackendStatus, DeviceInfo, ProbeKernel


class NodeSource:
    """A device source with no devices (JAX is not imported)."""

    name = "node"
    runs_probes = False

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """Nothing: the node's devices are the device-wide collectors' business."""
        return [], []

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """Never called: there are no devices."""
        raise LookupError(f"node mode reads no device's memory_stats() ({device.name})")

    def make_probe(self, device: DeviceInfo, size: int) -> ProbeKernel | None:
        """No probe in node mode."""
        return None
