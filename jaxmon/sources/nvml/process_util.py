"""Per-process utilization of one GPU: which process used how much of a GPU that several share (time-slicing, MPS).

NVML keeps a buffer of samples per process (SM, memory, encoder and decoder, each a percent of its sample period,
stamped with the CPU time in microseconds) and hands out those taken after a timestamp the caller passes:
`nvmlDeviceGetProcessesUtilizationInfo` (newer drivers, a versioned struct) or `nvmlDeviceGetProcessUtilization`.
Each GPU keeps the newest timestamp it was given (`Known.process_util_seen`, reset with its handle), so a poll gets
the samples since the previous one, and reduces them per pid to their **mean**: the process's share over the poll
interval (a driver samples every 1/6 s to 1 s, so a 5 s poll sees several samples per process; the latest alone
would be one sample period's, the noise a scrape aliases). NVML returns a sample only for a process "that had some
non-zero utilization during the last sample period" (nvml.h), so a compute process NVML lists as running on the GPU
with no sample since the previous poll reads 0 (`samples` 0): idle, its series steady rather than coming and going;
a sampled pid NVML does not list (a graphics process) keeps its entry. NVML answers NOT_FOUND when no sample is new:
every listed process idle, not an error. MIG-enabled GPUs do not support the calls (nvml.h): None, as on a driver
without them, which is learnt once (`Versions`) and never logged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pynvml

from jaxmon.sources.nvml.calls import ABSENT, OLDER, Versions
from jaxmon.sources.nvml.readings import Process, ProcessUtilization

# No sample since the timestamp (NOT_FOUND); pynvml raises NVMLError(SUCCESS) where the size query found none.
_NONE_NEW = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS)


def read(
    handle: Any, versions: Versions, since: int, running: Iterable[Process] | None = None
) -> tuple[tuple[ProcessUtilization, ...] | None, int]:
    """(each process's mean utilization over its samples after `since`, `running`'s unsampled ones at 0, by pid;
    the newest sample's timestamp), or (None, since) where NVML offers no per-process utilization on this GPU or
    driver. Other NVML errors raise."""
    found, seen = _samples(handle, versions, since)
    if found is None:
        return None, since
    sampled = {p.pid for p in found}
    idle = {p.pid for p in running or () if p.pid not in sampled}
    if idle:
        zeros = [ProcessUtilization(pid, 0.0, 0.0, 0.0, 0.0, 0) for pid in idle]
        found = tuple(sorted([*found, *zeros], key=lambda p: p.pid))
    return found, seen


def _samples(handle: Any, versions: Versions, since: int) -> tuple[tuple[ProcessUtilization, ...] | None, int]:
    if not versions.process_utilization:
        return None, since
    samples = None
    if versions.processes_utilization_info:
        try:
            samples = pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, since)
        except pynvml.NVMLError as err:
            if err.value in _NONE_NEW:
                return (), since
            if err.value in OLDER:
                versions.processes_utilization_info = False
            elif err.value not in ABSENT:
                raise
            # NOT_SUPPORTED from the newer call: the older one may still answer on this GPU.
    if samples is None:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError as err:
            if err.value in _NONE_NEW:
                return (), since
            if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                versions.process_utilization = False
                return None, since
            if err.value in ABSENT:
                return None, since
            raise
    return reduce(samples), max([since, *(int(s.timeStamp) for s in samples)])


def reduce(samples: Iterable[Any]) -> tuple[ProcessUtilization, ...]:
    """The mean of each pid's samples (NVML's percent as a ratio), by pid."""
    sums: dict[int, list[int]] = {}
    for s in samples:
        acc = sums.setdefault(int(s.pid), [0, 0, 0, 0, 0])
        acc[0] += int(s.smUtil)
        acc[1] += int(s.memUtil)
        acc[2] += int(s.encUtil)
        acc[3] += int(s.decUtil)
        acc[4] += 1
    return tuple(
        ProcessUtilization(pid, sm / n / 100.0, mem / n / 100.0, enc / n / 100.0, dec / n / 100.0, n)
        for pid, (sm, mem, enc, dec, n) in sorted(sums.items())
    )
