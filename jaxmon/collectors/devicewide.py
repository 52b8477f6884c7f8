"""Families that several device-wide sources share (NVML on GPU, libtpu on TPU): one name, one meaning, one HELP.

Each series carries `device`, `platform` and `source`; the exposition merges the samples of collectors that render
the same family, so one dashboard row serves GPUs and TPUs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from prometheus_client.core import Metric

from jaxmon.collectors.base import family

SHARED = {
    "jaxmon_device_source_up": (
        "1 when the device-wide source (label source) answered for this device in its last poll, 0 when it failed.",
        False,
    ),
    "jaxmon_device_memory_total_bytes": ("Device memory in total, as the device-wide source reports it.", False),
    "jaxmon_device_memory_used_bytes": (
        "Device memory in use by all processes (device-wide, not one allocator's bytes_in_use).",
        False,
    ),
    "jaxmon_device_duty_cycle_ratio": (
        "Share of the source's last sample period in which the device ran any kernel (0-1); device-wide.",
        False,
    ),
    "jaxmon_device_memory_bandwidth_utilization_ratio": (
        "Share of the last sample period in which device memory was read or written (0-1); device-wide.",
        False,
    ),
}


def shared_family(name: str) -> Metric:
    """A fresh, empty family of one of the shared names."""
    help_text, counter = SHARED[name]
    return family(name, help_text, counter)


# A device whose duty cycle is at least this is busy with other work: the probe does not calibrate on it.
BUSY_DUTY_CYCLE = 0.05


@runtime_checkable
class DutyCycles(Protocol):
    """A device-wide collector's state that knows each device's duty cycle (NVML, libtpu)."""

    def duty_cycle(self, platform: str, device: int) -> float | None:
        """The device's last duty cycle in 0-1, None when this source does not know the device."""
