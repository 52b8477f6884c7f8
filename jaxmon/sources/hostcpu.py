"""Host CPU time from /proc (Linux): the device-wide reading for CPU devices, whose device is the host's cores.

Raw tick counts only (USER_HZ, 100 per second on Linux); the probe collector derives others' share from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# /proc/stat's aggregate `cpu` line: user nice system idle iowait irq softirq steal guest guest_nice. Busy is what
# ran on this host's CPUs; steal (the hypervisor ran someone else) and guest time (already in user) are left out.
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_IDLE_FIELDS = (3, 4)


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative ticks: the host's CPUs busy, busy + idle, and this process (all its threads)."""

    busy: int
    total: int
    own: int


def read_cpu_times(stat: Path = Path("/proc/stat"), self_stat: Path = Path("/proc/self/stat")) -> CpuTimes | None:
    """The host's and this process's CPU ticks now; None where /proc does not have them (not Linux)."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
        mine = self_stat.read_text()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 8:
        return None
    ticks = [int(v) for v in first[1:]]
    busy = sum(ticks[i] for i in _BUSY_FIELDS)
    # The command name (field 2) may hold spaces and parentheses: fields after its last ')' start at field 3.
    after = mine[mine.rindex(")") + 2 :].split()
    own = int(after[11]) + int(after[12])  # utime (field 14) + stime (field 15)
    return CpuTimes(busy=busy, total=busy + sum(ticks[i] for i in _IDLE_FIELDS), own=own)
