"""Families that several device-wide sources share (NVML on GPU, libtpu on TPU): one name, one meaning, one HELP.

Also the busy signal the probe reads: a duty cycle from those, and the host's CPU time for CPU devices.

Each series carries `device`, `platform` and `source`; the exposition merges the samples of collectors that render
the same family, so one dashboard row serves GPUs and TPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from prometheus_client.core import Metric

from jaxmon.collectors.base import family
from jaxmon.sources.hostcpu import CpuTimes, read_cpu_times

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


class HostCpuMeter:
    """Others' share of the host's CPU time since the previous reading: the device-wide signal of CPU devices.

    A daemon of its own (`exclude_own`) leaves its own ticks out (its probe runs and scrapes are not the
    workload); inside a training process they stay in, since the workload's ticks are this process's too.
    """

    # Fewer ticks than this since the previous reading (0.1 s of two cores at USER_HZ 100) are too coarse to judge.
    MIN_TICKS = 20

    def __init__(self, exclude_own: bool, read: Callable[[], CpuTimes | None] = read_cpu_times) -> None:
        self._exclude_own = exclude_own
        self._read = read
        self._last = read()
        self._lock = threading.Lock()

    def others_share(self) -> float | None:
        """Share (0-1) of the host's CPU time others used since the previous call; None without /proc."""
        with self._lock:
            last, now = self._last, self._read()
            if last is None or now is None:
                return None
            if now.total - last.total < self.MIN_TICKS:
                time.sleep(0.1)  # too short to judge: look over a tenth of a second more
                now = self._read()
                if now is None:
                    return None
            self._last = now
        elapsed = now.total - last.total
        if elapsed <= 0:
            return None
        busy = now.busy - last.busy - (now.own - last.own if self._exclude_own else 0)
        return min(max(busy / elapsed, 0.0), 1.0)
