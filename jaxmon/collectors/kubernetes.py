"""The `kubernetes` collector: which pod holds each GPU, MIG device and TPU chip, from the kubelet's pod-resources API.

Once per poll it calls `v1.PodResourcesLister/List` on the kubelet's socket (with a deadline) and keeps the
answer as its state. It is an owner source: its state offers the owners of each device (jaxmon.ownership.attribution
says how ids match and what a shared device is labelled) on the exchange (OWNERS), and the owner transform
(jaxmon.ownership.owners) adds `namespace`, `pod` and `container` to every series of a device a pod holds, whatever
collector made it. Where this collector does not run, every series renders as without it.

A kubelet that does not answer (no socket, too slow, an error status) fails the poll
(metrics.COLLECTOR_SUCCESS 0 for `collector="kubernetes"`); the last good answer stays in use for `--collector.
kubernetes.ttl` (a kubelet restart takes seconds, and labels that come and go would split every series in two),
then the labels go: a mapping older than that may name pods that are gone. Scrapes never wait on the kubelet.

Devices allocated through Dynamic Resource Allocation come in the same List (`dynamic_resources`), named by
(driver, pool, device); where the node's name is known (`--collector.kubernetes.node-name`, $NODE_NAME) the node's
ResourceSlices, listed from the API server on a thread of its own (jaxmon.sources.kubernetes_api: every
`--collector.kubernetes.resourceslice-interval`, and at once when a claimed device is not in them yet, the poll
waiting for that at most `--collector.kubernetes.timeout`), say which GPU, MIG device or TPU chip each is
(jaxmon.ownership.dra). The state keeps that resolution (`dra`) beside the device-plugin attribution, and offers both to
the owner transform (`KubernetesState.owners`), so a pod that got its GPUs through DRA labels their series as a device
plugin's would; metrics.KUBERNETES_POD_DEVICE_INFO lists the claimed devices with their `claim`, the API
server's health is metrics.KUBERNETES_API_*, and a claimed device no slice names is counted in
metrics.KUBERNETES_DRA_PROBLEMS by reason, never labelled.

The processes NVML reports on each GPU (the nvml collector's GPU_PROCESSES, its last poll) are owner-named too
where the API server's pods are listed: each one's pod UID and container id from `<--path.procfs>/<pid>/cgroup`
(hostPID), named by those pods (jaxmon.ownership.pidowners), offered as the transform's pid map, so a per-process series
carries its own pod where several pods share a GPU; a process of a pod the list does not name carries none, and is
counted in metrics.KUBERNETES_PROCESS_PROBLEMS by reason.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import structlog
from prometheus_client.core import Metric
from pydantic import BeforeValidator, Field

from jaxmon.catalog import metrics
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Offers, Update
from jaxmon.exchange import GPU_PROCESSES, OWNERS, Owner, Owners
from jaxmon.families import add
from jaxmon.logsetup import ErrorLog
from jaxmon.ownership.attribution import GPU_RESOURCES, TPU_RESOURCES, Attribution, accelerators, attribute
from jaxmon.ownership.pidowners import POD_NOT_LISTED, PodProcesses
from jaxmon.settings import CollectorOptions, Enabled, format_duration, parse_duration
from jaxmon.settings.durations import bounded
from jaxmon.snapshot import Snapshot
from jaxmon.sources.cgroups import ProcessCgroups
from jaxmon.sources.kubelet import (
    DEFAULT_SOCKET,
    Allocation,
    ClaimedDevice,
    KubeletUnavailable,
    PodResourcesClient,
    socket_problem,
)
from jaxmon.sources.kubelet.stubs import StubsUnavailable

if TYPE_CHECKING:  # imported where the node's name is known or the kubelet reports DRA claims (RSS: issue 35)
    from jaxmon.ownership.dra import ProblemCounter, Resolution
    from jaxmon.sources.cluster_cache import ApiHealth, ClusterCache
    from jaxmon.sources.kubernetes_api import PodIndex

log = structlog.get_logger("jaxmon.collectors.kubernetes")

# Where Kubernetes mounts the pod's service account (client-go's in-cluster configuration): the one place it is
# written, the default of --collector.kubernetes.service-account, which the API source is given.
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _names(value: Any) -> Any:
    """A comma-separated flag or variable (`nvidia.com/gpu,nvidia.com/mig-*`) as a list; a YAML list as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


ResourceNames = Annotated[tuple[str, ...], BeforeValidator(_names)]


class KubernetesOptions(CollectorOptions):
    """`--collector.kubernetes.*`."""

    enabled: Enabled = Field(
        default="auto", description="true, false, or auto (on where the kubelet's pod-resources socket exists)."
    )
    socket: Path = Field(
        default=DEFAULT_SOCKET,
        description="The kubelet's pod-resources socket. In a container, mount its directory read-only, not the "
        "socket: a kubelet restart replaces it.",
    )
    timeout: Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 60.0)] = Field(
        default=2.0, description="Deadline of one List call; keep it well under the poll interval."
    )
    ttl: Annotated[float, BeforeValidator(parse_duration), bounded(None, 86400.0)] = Field(
        default=15.0,
        ge=0,
        description="How long the last good answer keeps labelling devices while the kubelet does not answer "
        "(0: the labels go with the first failed call).",
    )
    gpu_resources: ResourceNames = Field(
        default=GPU_RESOURCES,
        description="Resource names whose device ids are GPUs (GPU-..., nvidiaN, MIG-...), comma-separated; "
        "* matches any text.",
    )
    tpu_resources: ResourceNames = Field(
        default=TPU_RESOURCES, description="Resource names whose device ids are TPU chips, comma-separated."
    )
    # The API server (jaxmon.sources.kubernetes_api): the node's ResourceSlices, which say what a DRA claim's device
    # is, and its pods.
    resourceslice_interval: Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 86400.0)] = Field(
        default=60.0,
        description="How often the node's ResourceSlices and pods are listed from the API server (also at once, "
        "at most every 5 s, when a newly claimed device or a GPU process's pod is not yet in them); an API server "
        "that does not answer leaves the last good lists in use.",
    )
    api_timeout: Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 60.0)] = Field(
        default=5.0, description="Deadline of one request to the API server (a list of several pages: 6 times that)."
    )
    node_name: str = Field(
        default="",
        description="This node's name, to list its ResourceSlices and pods (empty: $NODE_NAME, which the "
        "DaemonSet sets from the downward API).",
    )
    service_account: Path = Field(
        default=SERVICE_ACCOUNT,
        description="The directory of the service account's token and ca.crt; the API server is "
        "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.",
    )


@dataclass(frozen=True)
class KubernetesState:
    """The mapping in use: the accelerators the kubelet assigned, and who holds each device; empty when none."""

    devices: tuple[Allocation, ...] = ()
    attribution: Attribution = field(default_factory=Attribution)
    # Monotonic time of the List call this mapping comes from (None: no mapping).
    taken: float | None = None
    error: str | None = None
    # DRA: the claimed devices of GPU and TPU drivers, resolved through the node's ResourceSlices (holders by
    # device identity, the claim in each; None: no claims and no node name), the API server's health and the
    # node's pods (uid -> namespace and name, container id -> container: for process owners) (None: no node name).
    dra: Resolution | None = None
    api: ApiHealth | None = None
    pods: PodIndex | None = None
    dra_problems: Mapping[str, int] = field(default_factory=dict)
    # The owners of the processes on the GPUs (pid -> owners; empty: a pod the pods list does not name), and how
    # many processes of unnamed pods were found (None: no pods list, so no process is named).
    processes: Mapping[int, frozenset[Owner]] = field(default_factory=dict)
    process_problems: int | None = None

    @property
    def owners(self) -> Owners:
        """What the owner transform is offered: the device plugins' holders and, beside them, DRA's; the processes'."""
        owners = self.attribution.owners
        if self.dra is not None and self.dra.devices:
            owners = Owners.merged([owners, self.dra.owners])
        return replace(owners, pids=self.processes) if self.processes else owners


@register
class KubernetesCollector(Collector[KubernetesOptions, KubernetesState]):
    """Polls the kubelet's pod-resources List; offers the pods holding each device."""

    name = "kubernetes"
    description = (
        "Pods holding each GPU and TPU chip (the kubelet's pod-resources API): pod, namespace and container labels "
        "on every series of a held device."
    )
    options = KubernetesOptions
    order = 70
    # The kubelet's state is not this process's health: a missing socket must not restart jaxmon.
    heartbeat = False
    offers: ClassVar[Offers] = {OWNERS: lambda state: state.owners}

    def __init__(self, opts: KubernetesOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self._client: PodResourcesClient | None = None
        # One line when the kubelet stops answering or the reason changes, one when it answers again.
        self._errors = ErrorLog(log, math.inf)
        self._good: KubernetesState | None = None
        self._cache: ClusterCache | None = None
        self._problems: ProblemCounter | None = None
        self._cgroups = ProcessCgroups(ctx.procfs)
        self._processes = PodProcesses()

    @classmethod
    def unavailable(cls, opts: KubernetesOptions, ctx: Context) -> str | None:
        """Needs grpcio and protobuf (the committed stubs); on `auto`, also the socket.

        Found, not imported: importing grpc costs about 13 MiB of RSS (BENCHMARKS.md, node mode), not to be paid
        where no kubelet listens (a GPU node outside Kubernetes in node mode); the client imports it when it is made.
        """
        import importlib.util

        for module, package in (("grpc", "grpcio"), ("google.protobuf", "protobuf")):
            if importlib.util.find_spec(module) is None:
                return f"{package} is not installed (no module named {module!r})"
        if opts.enabled is True:
            return None
        problem = socket_problem(opts.socket)
        return None if problem is None else f"no kubelet pod-resources socket ({problem[1]})"

    def update(self) -> Update[KubernetesState]:
        """One List call; on failure the last good mapping while it is younger than the ttl, else none."""
        done = self._update()
        cache = self._api_cache()  # None without a node name
        view = cache.view() if cache is not None else None
        api, pods = (cache.health(), view.pods) if cache is not None and view is not None else (None, None)
        problems = dict(self._problems.counts) if self._problems is not None else {}
        # The processes on the GPUs at the nvml collector's last poll: their cgroups read (where a pods list can name
        # them), the pods those name asked of the API server (a pod newer than the list: listed again at once, named
        # at a next poll), then named by the pods list (jaxmon.ownership.pidowners).
        wanted = {pid for processes in self.ctx.exchange.read(GPU_PROCESSES) for gpu in processes for pid in gpu.pids}
        found = self._cgroups.read_all(wanted) if pods is not None else {}
        if cache is not None:
            cache.want_pods(c.pod.uid for c in found.values() if c.pod is not None)
        named = self._processes.update(wanted, found, pods, view.pods_taken if view is not None else None)
        state = replace(
            done.state,
            api=api,
            pods=pods,
            dra_problems=problems,
            processes=named.pids,
            process_problems=None if pods is None else self._processes.problems,
        )
        return replace(done, state=state)

    def _update(self) -> Update[KubernetesState]:
        now = time.monotonic()
        try:
            if self._client is None:
                self._client = PodResourcesClient(self.opts.socket, self.opts.timeout)
            listed = self._client.list_all()
        except KubeletUnavailable as exc:
            return self._failed(exc.code, str(exc), now)
        except StubsUnavailable as exc:
            return self._failed("stubs", str(exc), now)
        except Exception as exc:
            # Not left to the runtime's guard, which keeps the last state: that would keep old labels for ever.
            return self._failed(type(exc).__name__, f"{type(exc).__name__}: {exc}", now)
        self._errors.ok("kubelet", "kubelet pod-resources answer again", socket=str(self.opts.socket))
        gpu, tpu = self.opts.gpu_resources, self.opts.tpu_resources
        kept = accelerators(listed.allocations, gpu, tpu)
        self._good = KubernetesState(
            devices=kept, attribution=attribute(kept, gpu, tpu), taken=now, dra=self._resolve(listed.claimed)
        )
        return Update(self._good, success=True)

    def _resolve(self, claimed: tuple[ClaimedDevice, ...]) -> Resolution | None:
        """The claimed GPUs and TPU chips through the node's ResourceSlices, asking the API server again (and
        waiting at most the kubelet's deadline) when one is not in them yet; None without claims or a node name."""
        if not claimed and not self._node():
            return None
        from jaxmon.ownership.dra import ProblemCounter, Resolution, accelerator_driver, resolve

        if self._problems is None:
            self._problems = ProblemCounter()
        claimed = tuple(c for c in claimed if accelerator_driver(c.driver))
        cache = self._api_cache()
        if not claimed:
            found = Resolution()
        elif cache is None:
            self._errors.error(
                "node-name",
                "DRA devices cannot be resolved",
                "no node name: set --collector.kubernetes.node-name or $NODE_NAME (the downward API's spec.nodeName)",
            )
            found = resolve({}, claimed)
        else:
            view = cache.want([(c.driver, c.pool, c.device) for c in claimed], wait=self.opts.timeout)
            found = resolve(view.slices, claimed)
        self._problems.observe(found)
        return found

    def _node(self) -> str:
        return self.opts.node_name or os.environ.get("NODE_NAME", "")

    def _api_cache(self) -> ClusterCache | None:
        """The API server's lists of this node, started at the first poll where the node's name is known."""
        if self._cache is None:
            node = self._node()
            if not node:
                return None
            from jaxmon.sources.cluster_cache import ClusterCache
            from jaxmon.sources.kubernetes_api import ApiClient, InCluster

            account, timeout = self.opts.service_account, self.opts.api_timeout
            self._cache = ClusterCache(
                lambda: ApiClient(InCluster.from_env(None, account), timeout=timeout, deadline=6 * timeout),
                node,
                interval=self.opts.resourceslice_interval,
            ).start()
        return self._cache

    def _failed(self, code: str, error: str, now: float) -> Update[KubernetesState]:
        good = self._good
        # The labels of the last good answer stay up to the ttl after it (said once, with the failure).
        kept = {} if good is None else {"labels_kept": f"up to {format_duration(self.opts.ttl)} after the last answer"}
        self._errors.error(
            "kubelet", "kubelet pod-resources unavailable", error, same=code, socket=str(self.opts.socket), **kept
        )
        if good is not None and good.taken is not None and now - good.taken <= self.opts.ttl:
            return Update(replace(good, error=error), success=False)
        if good is not None:
            log.warning(
                "pod labels dropped: the kubelet has not answered for longer than the ttl",
                ttl=format_duration(self.opts.ttl),
            )
            self._good = None
        return Update(KubernetesState(error=error), success=False)

    def families(self, snap: Snapshot, state: KubernetesState) -> Iterator[Metric]:
        devices = metrics.KUBERNETES_POD_DEVICE_INFO.new()
        for a in state.devices:
            for device_id in a.device_ids:
                labels = {"namespace": a.namespace, "pod": a.pod, "container": a.container, "resource": a.resource}
                add(devices, {**labels, "device_id": device_id}, 1.0)
        # DRA: the driver as the resource, pool/device as the id, and the claim (resolved or not).
        dra = state.dra
        for c in () if dra is None else (*(c for c, _ in dra.resolved), *(u.claimed for u in dra.unresolved)):
            labels = {"namespace": c.namespace, "pod": c.pod, "container": c.container, "resource": c.driver}
            add(devices, {**labels, "device_id": f"{c.pool}/{c.device}", "claim": c.claim}, 1.0)
        yield devices
        if state.api is None and not state.dra_problems:
            return  # no node name and no DRA claims: nothing to say (a cluster without DRA)
        if state.api is not None:
            yield from health_families(state.api)
        from jaxmon.ownership.dra import NO_IDENTITY, NOT_IN_SLICES

        problems = metrics.KUBERNETES_DRA_PROBLEMS.new()
        for reason, count in sorted({NOT_IN_SLICES: 0, NO_IDENTITY: 0, **state.dra_problems}.items()):
            add(problems, {"reason": reason}, float(count))
        yield problems
        if state.process_problems is not None:
            processes = metrics.KUBERNETES_PROCESS_PROBLEMS.new()
            add(processes, {"reason": POD_NOT_LISTED}, float(state.process_problems))
            yield processes

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cache is not None:
            self._cache.stop()
            self._cache = None


def health_families(health: ApiHealth) -> Iterator[Metric]:
    """The API server's health in the exposition: up per list, failures by reason, last success."""
    up, failures = metrics.KUBERNETES_API_UP.new(), metrics.KUBERNETES_API_FAILURES.new()
    last = metrics.KUBERNETES_API_LAST_SUCCESS_TIMESTAMP_SECONDS.new()
    for name, ok in sorted(health.up.items()):
        add(up, {"list": name}, 1.0 if ok else 0.0)
    for (name, reason), count in sorted(health.failures.items()):
        add(failures, {"list": name, "reason": reason}, float(count))
    for name, when in sorted(health.last_success.items()):
        add(last, {"list": name}, when)
    yield from (up, failures, last)
