"""Whether a device was busy with other work: the probe's gate for calibrating and for its idle baseline.

A device-wide duty cycle (NVML, libtpu) says it for GPUs and TPUs; CPU devices are the host's cores, so the host's
CPU time outside jaxmon says it for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from jaxmon.sources.hostcpu import CpuTimes, read_cpu_times

# A device whose duty cycle is at least this is busy with other work: the probe does not calibrate on it.
BUSY_DUTY_CYCLE = 0.05


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
