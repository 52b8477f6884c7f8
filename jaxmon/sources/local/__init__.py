"""This process's JAX, the only code that imports it: devices, memory_stats(), the probe kernel, a workload's view
of itself (live arrays, compilations) and the training telemetry's device-side steps."""

from jaxmon.sources.local.devices import FRACTION_VARS, PREALLOCATE_VAR, LocalSource, apply_gpu_env_defaults
from jaxmon.sources.local.probe import JaxProbeKernel
from jaxmon.sources.local.workload import CompileCounters, InProcessWorkload, gzipped, live_array_bytes

__all__ = [
    "FRACTION_VARS",
    "PREALLOCATE_VAR",
    "CompileCounters",
    "InProcessWorkload",
    "JaxProbeKernel",
    "LocalSource",
    "apply_gpu_env_defaults",
    "gzipped",
    "live_array_bytes",
]
