"""Which pod runs each process on a GPU: the process's cgroup (a reading of jaxmon.sources.cgroups: pod UID and
container id) named by the API server's pods on this node (jaxmon.sources.kubernetes_api.PodIndex: namespace, pod,
container name), as the owner transform's pid map (`Owners.pids`), so that each per-process series (`jaxmon_process_*`,
with `pid`) carries its own pod's labels where a time-sliced or MPS GPU is held by several pods, as dcgm-exporter's
pidmapper does (PR #594).

The path runs one way. Each poll the kubernetes collector reads the sources: the pids the nvml collector reported
(GPU_PROCESSES), their cgroups (`ProcessCgroups.read_all`), and the API server's pods (the cluster cache, which it
tells of every pod UID those cgroups name, so that a pod newer than its list is listed again at once:
`ClusterCache.want_pods` in jaxmon.sources.cluster_cache); it hands those readings to `PodProcesses.update` here, which
names them; its state offers the result as the owner transform's pid map. The rules:

- A process whose cgroup names a pod the pods list has: that pod's namespace and name, and the container whose id
  its cgroup names (the list's container statuses); a container id the list does not name (yet), or names in another
  pod, gives the pod without a container name, never another container's.
- A process whose cgroup names a pod the list does not have (a pod newer than the last list, or none listed yet):
  no owner labels at all on its series (an empty owner set: the transform then writes none), never its GPU's
  holders, which may be other pods. The collector has asked for a pods list at once (above), so a new pod's
  processes are named a poll or two later. A process whose pod a list
  taken after it was first seen still does not name (a static pod, whose mirror has another UID) is counted once
  (metrics.KUBERNETES_PROCESS_PROBLEMS, `reason="pod_not_listed"`) and logged once.
- A process whose cgroup names no pod (the host's, a plain container's), or that ended before its cgroup was read,
  is not in the map: its series keep their GPU's owners, as before.

The kubelet's pod-resources API names pods by namespace and name only (`PodResources{name, namespace,
containers}`, no UID, no container id: api.proto), so a cgroup's UID can be named only from the API server's pods:
without a node name (no API server lists) no process gets an owner of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from jaxmon.exchange import Owner
from jaxmon.logsetup import ErrorLog
from jaxmon.sources.cgroups import ProcessCgroup

if TYPE_CHECKING:  # the API server's client is imported only where a node name is known (RSS)
    from jaxmon.sources.kubernetes_api import PodIndex

log = structlog.get_logger("jaxmon.ownership.pidowners")

POD_NOT_LISTED = "pod_not_listed"


@dataclass(frozen=True)
class Named:
    """A poll's processes named: pid -> owners (empty: known to be a pod's the list does not name), and the pod UID
    of each pid the list does not name."""

    pids: Mapping[int, frozenset[Owner]] = field(default_factory=dict)
    unlisted: Mapping[int, str] = field(default_factory=dict)


def name_processes(found: Mapping[int, ProcessCgroup], pods: PodIndex) -> Named:
    """The owners of the processes `found` in their cgroups (ProcessCgroups.read_all) as `pods` names them."""
    pids: dict[int, frozenset[Owner]] = {}
    unlisted: dict[int, str] = {}
    for pid, owner in found.items():
        pod = owner.pod
        if pod is None:
            continue  # a Slurm job's (jaxmon.collectors.slurm) or nobody's: its GPU's owners, as before
        named = pods.pods.get(pod.uid)
        if named is None:
            pids[pid] = frozenset()
            unlisted[pid] = pod.uid
            continue
        held = pods.containers.get(pod.container_id) if pod.container_id else None
        container = held[1] if held is not None and held[0] == pod.uid else ""
        pids[pid] = frozenset({Owner(named[0], named[1], container)})
    return Named(pids, unlisted)


class PodProcesses:
    """The owners of the processes on the node's GPUs: their cgroups named by the API server's pods; counts the
    processes of pods the list does not name, each once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: dict[tuple[int, str], float] = {}  # (pid, pod UID) unnamed -> when first seen so
        self._counted: set[tuple[int, str]] = set()
        self.problems = 0
        self._errors = ErrorLog(log, math.inf)

    def update(
        self, wanted: Set[int], found: Mapping[int, ProcessCgroup], pods: PodIndex | None, taken: float | None
    ) -> Named:
        """The owners of the processes `wanted` (the pids on the GPUs), `found` in their cgroups (those that name
        one), by `pods` (None: no API server, so none can be named); `taken`: when that pods list came (the clock's
        time; None before the first), which says whether an unnamed pod is a problem yet."""
        if pods is None:
            if wanted:
                self._errors.error(
                    "no-pods",
                    "processes on the GPUs keep their GPU's owners",
                    "naming a process's pod needs the API server's pods: set --collector.kubernetes.node-name or "
                    "$NODE_NAME (the kubelet's pod-resources API names no pod UID)",
                )
            return Named()
        named = name_processes(found, pods)
        now = self._clock()
        self._first = {key: self._first.get(key, now) for key in named.unlisted.items()}
        if taken is not None:
            new = {key for key, first in self._first.items() if taken > first} - self._counted
            for pid, uid in sorted(new):
                log.warning("a process on a GPU runs in a pod the API server does not list", pid=pid, pod_uid=uid)
            self.problems += len(new)
            # Only the pids still reported are remembered: a pid reused by another unnamed pod counts again.
            self._counted = {(pid, uid) for pid, uid in self._counted | new if pid in wanted}
        return named
