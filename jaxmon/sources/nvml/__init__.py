"""NVML through nvidia-ml-py (`pynvml`): device-wide readings of every GPU, and a thread that counts Xid events.

pynvml loads `libnvidia-ml.so.1` with ctypes, so it needs no JAX GPU backend and allocates no device memory: a CPU
image monitors GPUs through the driver library the container toolkit mounts.

- `calls`: which errors mean an absent series, the versioned calls' fallbacks, error names;
- `readings`: what one poll of one GPU holds;
- `device`: one GPU's reads (what a handle gives once, what every poll asks);
- `nvlink`, `mig`: NVLink per link, MIG devices;
- `gpm`: the GPM profiling metrics (SM, tensor and DRAM activity) over the interval between two samples;
- `library`: the initialised library, its handles and the Xid watcher.
"""

from __future__ import annotations

from jaxmon.sources.nvml.calls import NvmlUnavailable, describe, probe_library, probe_reason
from jaxmon.sources.nvml.library import Nvml
from jaxmon.sources.nvml.readings import (
    CLOCKS_EVENT_REASONS,
    GPM_METRICS,
    NVLINK_ERROR_KINDS,
    GpmValues,
    GpuReading,
    MigDevice,
    NvLink,
    Process,
    ProcessUtilization,
    RemappedRows,
)

__all__ = [
    "CLOCKS_EVENT_REASONS",
    "GPM_METRICS",
    "NVLINK_ERROR_KINDS",
    "GpmValues",
    "GpuReading",
    "MigDevice",
    "NvLink",
    "Nvml",
    "NvmlUnavailable",
    "Process",
    "ProcessUtilization",
    "RemappedRows",
    "describe",
    "probe_library",
    "probe_reason",
]
