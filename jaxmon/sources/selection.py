"""Which discovered devices jaxmon reads: the host's CPU backend is left out beside an accelerator.

JAX starts its CPU backend on every host. Where a GPU or TPU backend is up too, the CPU "device" is the host's own
cores: read, it adds a second device identity (metrics.DEVICE_INFO), memory series that say `supported` 0, probe
runs every interval and a utilization that only tracks the host's load, to every dashboard. So by default only the
accelerators' devices are read there; CPU devices are read where they are the only devices, or when
`devices.include_cpu` asks (a job that places work on CPU devices on purpose).
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxmon.device_readings import DeviceInfo

CPU = "cpu"


def select_devices(devices: Sequence[DeviceInfo], include_cpu: bool) -> tuple[list[DeviceInfo], list[DeviceInfo]]:
    """The devices to read and those left out (the host's CPU devices where another platform has devices)."""
    if include_cpu or all(d.platform == CPU for d in devices):
        return list(devices), []
    kept = [d for d in devices if d.platform != CPU]
    left_out = [d for d in devices if d.platform == CPU]
    return kept, left_out
