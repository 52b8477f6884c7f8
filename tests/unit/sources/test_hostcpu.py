"""Host CPU time from /proc: the parser against files in /proc's format, and the meter (jaxmon/probe/idle.py)
reading this process's own work. A busy child beside the meter is tests/e2e/sources/test_hostcpu.py."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jaxmon.probe.idle import HostCpuMeter
from jaxmon.sources.hostcpu import CpuTimes, read_cpu_times


def test_the_aggregate_line_and_this_processs_ticks_are_read_as_documented(tmp_path: Path) -> None:
    """busy = user + nice + system + irq + softirq; total adds idle and iowait; steal and guest are left out."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 20 30 4000 50 6 7 800 900 0\ncpu0 1 2 3 4 5 6 7 8 9 0\nintr 1\n")
    self_stat = tmp_path / "self"
    # A command name with spaces and a ')' of its own: fields are counted from the last ')'.
    fields = ["S"] + [str(i) for i in range(4, 53)]
    fields[14 - 3], fields[15 - 3] = "111", "222"
    self_stat.write_text(f"4242 (a (b) c) {' '.join(fields)}\n")
    assert read_cpu_times(stat, self_stat) == CpuTimes(busy=100 + 20 + 30 + 6 + 7, total=163 + 4000 + 50, own=333)


def test_no_proc_reads_none(tmp_path: Path) -> None:
    assert read_cpu_times(tmp_path / "missing", tmp_path / "missing") is None
    odd = tmp_path / "odd"
    odd.write_text("intr 1 2 3\n")
    assert read_cpu_times(odd, Path("/proc/self/stat")) is None


class Readings:
    """Real readings of /proc, each taken beside this process's CPU time (time.process_time()). Each meter made
    over its own `reader()` goes through them in order; the first to need the next one takes it."""

    def __init__(self) -> None:
        self.taken: list[tuple[CpuTimes | None, float]] = []

    def reader(self) -> Callable[[], CpuTimes | None]:
        position = 0

        def read() -> CpuTimes | None:
            nonlocal position
            if position == len(self.taken):
                self.taken.append((read_cpu_times(), time.process_time()))
            position += 1
            return self.taken[position - 1][0]

        return read


def test_a_daemon_leaves_its_own_ticks_out_and_a_training_process_keeps_them() -> None:
    """This process spins until it has had 0.3 s of CPU and 0.6 s of wall time have passed: the two meters differ by
    its own ticks (process_time is the truth).

    Both meters judge the same window (they share the readings of /proc), and the truth is over that window too:
    a pause between two reads on a loaded machine (a preemption beside CPU burners) moves the meters and the truth
    alike, where separate reads a few milliseconds apart would each see a different window. The comparison is in
    ticks: at load average 15 this process had 0.08 of the host's ticks over 3 s, a share no fixed tolerance can
    tell from nothing, while its 30 ticks of CPU are as plain as on a quiet machine."""
    readings = Readings()
    excluding = HostCpuMeter(exclude_own=True, read=readings.reader())
    including = HostCpuMeter(exclude_own=False, read=readings.reader())
    spin, started = time.process_time(), time.monotonic()
    while time.monotonic() - started < 0.6 or time.process_time() - spin < 0.3:
        assert time.monotonic() - started < 60, "0.3 s of CPU not had in 60 s"
    a, b = excluding.others_share(), including.others_share()
    (host0, cpu0), (host1, cpu1) = readings.taken[0], readings.taken[-1]
    assert host0 is not None and host1 is not None and a is not None and b is not None
    elapsed = host1.total - host0.total  # the host's ticks in the window, as the meters count them (steal is not)
    own = (cpu1 - cpu0) * os.sysconf("SC_CLK_TCK")  # this process's CPU in the window (the truth), in ticks
    assert own >= 30
    # The ticks the including meter counts beyond the excluding one's are this process's: within two ticks of
    # rounding each way (/proc counts whole ticks).
    assert (b - a) * elapsed == pytest.approx(own, abs=4)


def test_a_reading_too_soon_after_the_last_looks_a_tenth_of_a_second_longer() -> None:
    """10 ticks since the previous reading (fewer than MIN_TICKS): the meter reads again a tenth of a second later
    and judges over the longer window. The readings are scripted: with /proc's own, a pause of this process on a
    loaded machine could put enough ticks between two reads by itself."""
    script = iter(
        [CpuTimes(busy=0, total=0, own=0), CpuTimes(busy=5, total=10, own=0), CpuTimes(busy=30, total=40, own=4)]
    )
    stamps: list[float] = []

    def read() -> CpuTimes:
        stamps.append(time.monotonic())
        return next(script)

    meter = HostCpuMeter(exclude_own=True, read=read)
    assert meter.others_share() == (30 - 4) / 40
    assert len(stamps) == 3 and stamps[2] - stamps[1] >= 0.1
