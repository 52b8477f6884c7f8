"""The kubernetes collector's families of the API server and DRA (its kubelet family is listed in reference.py)."""

from __future__ import annotations

from jaxmon.families import Spec

API_UP = Spec(
    "jaxmon_kubernetes_api_up",
    "1 when the last list of the node's resourceslices or pods from the API server succeeded, 0 when it failed "
    "(the last good answer stays in use).",
)
API_FAILURES = Spec(
    "jaxmon_kubernetes_api_failures",
    "Lists of the node's resourceslices or pods from the API server that failed, by reason: config, unreachable, "
    "timeout, tls, unauthorized, forbidden, http_<status>, bad_answer.",
    True,
)
API_LAST_SUCCESS = Spec(
    "jaxmon_kubernetes_api_last_success_timestamp_seconds",
    "Unix time of the last successful list of the node's resourceslices or pods from the API server.",
)
DRA_PROBLEMS = Spec(
    "jaxmon_kubernetes_dra_problems",
    "DRA-claimed GPUs and TPU chips without an identity, each counted once when found: not_in_slices (no "
    "ResourceSlice of the node names its driver, pool and device), no_identity (named without a uuid or index). "
    "Their holders label no series.",
    True,
)
PROCESS_PROBLEMS = Spec(
    "jaxmon_kubernetes_process_problems",
    "Processes on the GPUs whose owner cannot be named, each counted once: pod_not_listed (its cgroup names a pod "
    "UID that a pods list of this node taken after the process was found does not list, e.g. a static pod). Their "
    "per-process series carry no pod.",
    True,
)
SPECS = (API_UP, API_FAILURES, API_LAST_SUCCESS, DRA_PROBLEMS, PROCESS_PROBLEMS)
