"""Host CPU time from /proc against a real busy process: a child spinning beside the meter.

The parser against files in /proc's format, and the meter against this process's own work, are in
tests/unit/sources/test_hostcpu.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jaxmon.probe.idle import HostCpuMeter
from jaxmon.sources.hostcpu import CpuTimes, read_cpu_times
from tests.helpers import wait_until


def _ticks_of(pid: int) -> int:
    after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(after[11]) + int(after[12])


def test_a_busy_process_beside_the_meter_reads_as_others_share() -> None:
    """A child spinning on one core: the host's ticks the meter counts as others' hold at least the child's own.

    Counted in ticks over the meter's own window (its two readings of /proc enclose the child's two), and the child
    spins until it has had half a second of CPU however busy the machine is: beside CPU burners a share of wall
    time is no measure (the child got 0.16 of the two cores in 1 s at load average 15), its ticks are."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    readings: list[CpuTimes | None] = []

    def read() -> CpuTimes | None:
        readings.append(read_cpu_times())
        return readings[-1]

    try:
        wait_until(lambda: _ticks_of(child.pid) > 0, 30, "the child spinning")
        meter = HostCpuMeter(exclude_own=True, read=read)
        before = _ticks_of(child.pid)
        wait_until(lambda: _ticks_of(child.pid) - before >= 50, 60, "half a second of the child's CPU", step=0.05)
        spun = _ticks_of(child.pid) - before
        share = meter.others_share()
    finally:
        child.kill()
        child.wait()
    first, last = readings[0], readings[-1]
    assert share is not None and first is not None and last is not None
    others = share * (last.total - first.total)
    # /proc/stat's per-CPU ticks are sampled where the child's own are exact: a few ticks either way.
    assert others >= spun - max(3, 0.1 * spun), (others, spun, last.total - first.total)
