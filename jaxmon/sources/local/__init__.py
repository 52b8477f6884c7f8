"""This process's JAX, the only code that imports it: devices, memory_stats(), the probe kernel, a workload's view
of itself (live arrays, compilations: `workload`) and the training telemetry's device-side steps (`training`).

A daemon reads its devices (`LocalSource`) and probes them; only a workload process (embedded, publisher) imports
`workload` and `training`, which hold the training tracker: a daemon loads none of the training wing."""

from jaxmon.sources.local.devices import FRACTION_VARS, PREALLOCATE_VAR, LocalSource, apply_gpu_env_defaults
from jaxmon.sources.local.probe import JaxProbeKernel

__all__ = ["FRACTION_VARS", "PREALLOCATE_VAR", "JaxProbeKernel", "LocalSource", "apply_gpu_env_defaults"]
