"""Host CPU time from /proc against a real busy process: a child spinning beside the meter.

The parser against files in /proc's format, and the meter against this process's own work, are in
tests/unit/sources/test_hostcpu.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from jaxmon.probe.idle import HostCpuMeter

TICKS = os.sysconf("SC_CLK_TCK")
CPUS = os.cpu_count() or 1


def _ticks_of(pid: int) -> int:
    after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(after[11]) + int(after[12])


def test_a_busy_process_beside_the_meter_reads_as_others_share() -> None:
    """A child spinning on one core: the meter's share is at least the child's CPU time over the host's."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        meter = HostCpuMeter(exclude_own=True)
        before, started = _ticks_of(child.pid), time.monotonic()
        time.sleep(1.0)
        share = meter.others_share()
        child_share = (_ticks_of(child.pid) - before) / (TICKS * (time.monotonic() - started) * CPUS)
    finally:
        child.kill()
        child.wait()
    assert share is not None
    assert child_share > 0.2  # independent truth: the child's own ticks
    assert share >= child_share - 0.05
