"""The slurm collector's family: which Slurm job's processes use which GPU, to join at query time.

One info series per (job, GPU), never a job label on the device series: a label that changes with every job would
split each GPU's series at each job (dcgm-exporter's `hpc_job` label did, until users dropped it for an info metric
joined at query time).
"""

from __future__ import annotations

from jaxmon.families import Spec

JOB_DEVICE_INFO = Spec(
    "jaxmon_slurm_job_device_info",
    "1 for each GPU a Slurm job's processes use (NVML's compute processes, whose cgroup names the job); join on uuid: "
    "... * on(uuid) group_left(job_id) jaxmon_slurm_job_device_info.",
)
