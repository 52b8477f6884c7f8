"""Every family that several collectors render: one name, one meaning, one HELP.

The exposition merges same-name families from different collectors (this process's devices beside spooled
workloads' devices; NVML beside libtpu), so each is declared here once and rendered with `Spec.new()`.
"""

from __future__ import annotations

from jaxmon.families import Spec

# The base families (this process's devices), the spool (workloads' devices) and NVML (each GPU's identity).
# For source="nvml", device_match says how `device` was assigned (nvml_index: NVML's index, no JAX device id).
DEVICE_INFO = Spec("jaxmon_device_info", "Identity of each device; always 1.")

# Device-wide sources (NVML on GPU, libtpu on TPU); every series carries `device`, `platform` and `source`.
DEVICE_SOURCE_UP = Spec(
    "jaxmon_device_source_up",
    "1 when the device-wide source (label source) answered for this device in its last poll, 0 when it failed.",
)
DEVICE_MEMORY_TOTAL = Spec(
    "jaxmon_device_memory_total_bytes", "Device memory in total, as the device-wide source reports it."
)
DEVICE_MEMORY_USED = Spec(
    "jaxmon_device_memory_used_bytes",
    "Device memory in use by all processes (device-wide, not one allocator's bytes_in_use).",
)
DEVICE_DUTY_CYCLE = Spec(
    "jaxmon_device_duty_cycle_ratio",
    "Share of the source's last sample period in which the device ran any kernel (0-1); device-wide.",
)
DEVICE_MEMORY_BANDWIDTH = Spec(
    "jaxmon_device_memory_bandwidth_utilization_ratio",
    "Share of the last sample period in which device memory was read or written (0-1); device-wide.",
)

# A workload process's identity: the spool's workloads, and an embedded workload itself (the base families).
WORKLOAD_INFO = Spec(
    "jaxmon_workload_info",
    "Each workload process reporting (to the spool, or an embedded exporter itself), with where the scheduler put "
    "it (pod, namespace, node, slurm_job_id where set); always 1.",
)
