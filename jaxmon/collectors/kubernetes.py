"""The `kubernetes` collector: which pod holds each GPU, MIG device and TPU chip, from the kubelet's pod-resources API.

Once per poll it calls `v1.PodResourcesLister/List` on the kubelet's socket (with a deadline) and keeps the
answer as its state. It is an owner source: its state offers the owners of each device (jaxmon.attribution says
how ids match and what a shared device is labelled) on the exchange (OWNERS), and the owner transform
(jaxmon.owners) adds `namespace`, `pod` and `container` to every series of a device a pod holds, whatever
collector made it. Where this collector does not run, every series renders as without it.

A kubelet that does not answer (no socket, too slow, an error status) fails the poll
(`jaxmon_collector_success{collector="kubernetes"} 0`); the last good answer stays in use for `--collector.
kubernetes.ttl` (a kubelet restart takes seconds, and labels that come and go would split every series in two),
then the labels go: a mapping older than that may name pods that are gone. Scrapes never wait on the kubelet.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar

import structlog
from prometheus_client.core import Metric
from pydantic import BeforeValidator, Field

from jaxmon.attribution import GPU_RESOURCES, TPU_RESOURCES, Attribution, accelerators, attribute
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Offers, Update
from jaxmon.families import add, family
from jaxmon.logsetup import ErrorLog
from jaxmon.owners import OWNERS
from jaxmon.settings import CollectorOptions, Enabled, format_duration, parse_duration
from jaxmon.settings.durations import bounded
from jaxmon.snapshot import Snapshot
from jaxmon.sources.kubelet import DEFAULT_SOCKET, Allocation, KubeletUnavailable, PodResourcesClient, socket_problem
from jaxmon.sources.kubelet.stubs import StubsUnavailable

log = structlog.get_logger("jaxmon.collectors.kubernetes")


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


@dataclass(frozen=True)
class KubernetesState:
    """The mapping in use: the accelerators the kubelet assigned, and who holds each device; empty when none."""

    devices: tuple[Allocation, ...] = ()
    attribution: Attribution = field(default_factory=Attribution)
    # Monotonic time of the List call this mapping comes from (None: no mapping).
    taken: float | None = None
    error: str | None = None


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
    offers: ClassVar[Offers] = {OWNERS: lambda state: state.attribution.owners}

    def __init__(self, opts: KubernetesOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self._client: PodResourcesClient | None = None
        # One line when the kubelet stops answering or the reason changes, one when it answers again.
        self._errors = ErrorLog(log, math.inf)
        self._good: KubernetesState | None = None

    @classmethod
    def unavailable(cls, opts: KubernetesOptions, ctx: Context) -> str | None:
        """Needs grpcio and protobuf (the committed stubs); on `auto`, also the socket.

        Found, not imported: grpc's C core costs about 20 MiB of RSS, not to be paid where no kubelet listens (a
        GPU node outside Kubernetes in node mode); the client imports it when it is made.
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
        now = time.monotonic()
        try:
            if self._client is None:
                self._client = PodResourcesClient(self.opts.socket, self.opts.timeout)
            found = self._client.list()
        except KubeletUnavailable as exc:
            return self._failed(exc.code, str(exc), now)
        except StubsUnavailable as exc:
            return self._failed("stubs", str(exc), now)
        except Exception as exc:
            # Not left to the runtime's guard, which keeps the last state: that would keep old labels for ever.
            return self._failed(type(exc).__name__, f"{type(exc).__name__}: {exc}", now)
        self._errors.ok("kubelet", "kubelet pod-resources answer again", socket=str(self.opts.socket))
        gpu, tpu = self.opts.gpu_resources, self.opts.tpu_resources
        kept = accelerators(found, gpu, tpu)
        self._good = KubernetesState(devices=kept, attribution=attribute(kept, gpu, tpu), taken=now)
        return Update(self._good, success=True)

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
        devices = family(
            "jaxmon_kubernetes_pod_device_info",
            "1 for each GPU, MIG device or TPU chip the kubelet assigned to a container (device_id as the device "
            "plugin names it); absent while the kubelet does not answer, after the ttl.",
        )
        for a in state.devices:
            for device_id in a.device_ids:
                labels = {"namespace": a.namespace, "pod": a.pod, "container": a.container, "resource": a.resource}
                add(devices, {**labels, "device_id": device_id}, 1.0)
        yield devices

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
