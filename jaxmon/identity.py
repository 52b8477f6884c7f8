"""Who a workload process is, beyond its JAX process index: its host and pid, and where the scheduler put it.

Kubernetes gives a container its pod, namespace and node through the Downward API (environment variables the pod
spec maps from `metadata.name`, `metadata.namespace` and `spec.nodeName`); Slurm sets the job id. Each is a label
of the workload's info series (metrics.WORKLOAD_INFO) where it is set, so any workload series joins them with
`group_left`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

# label -> the environment variable that carries it
SCHEDULER_VARIABLES = {
    "pod": "POD_NAME",
    "namespace": "POD_NAMESPACE",
    "node": "NODE_NAME",
    "slurm_job_id": "SLURM_JOB_ID",
}
MAX_VALUE = 253  # a Kubernetes name is at most 253 characters


def scheduler_labels(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The scheduler's names for this process, from the environment, where set."""
    env = os.environ if environ is None else environ
    return {label: env[var][:MAX_VALUE] for label, var in SCHEDULER_VARIABLES.items() if env.get(var)}


def host_name() -> str:
    """This host's name (what a publisher writes, and the `host` label of training series)."""
    return socket.gethostname()
