"""The kubelet's pod-resources API (v1): which devices the kubelet assigned to which pod and container.

`v1.PodResourcesLister/List` over the kubelet's unix socket, `/var/lib/kubelet/pod-resources/kubelet.sock` by
default (GA since Kubernetes 1.28; the kubelet rate-limits it to 100 calls a second, burst 10). A kubelet restart
replaces the socket, so a container mounts its directory, not the socket itself. Devices come two ways: a device
plugin's (`ContainerResources.devices`: a resource name and the plugin's device ids, `Allocation`) and Dynamic
Resource Allocation's (`ContainerResources.dynamic_resources`, on by default since Kubernetes 1.34: a claim and the
`(driver, pool, device)` names of its devices, `ClaimedDevice`, which the node's ResourceSlices resolve:
jaxmon.ownership.dra). Every call has a deadline, and
the channel is dropped after any failure, so the next call dials the socket afresh (a new kubelet's socket at
once, without gRPC's reconnect backoff). The stubs are protoc's output, committed (`stubs.py`); grpc is
imported when a client is made, never at jaxmon import time.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# A node with hundreds of pods and their CPU ids answers with more than gRPC's default 4 MiB.
MAX_MESSAGE_BYTES = 16 << 20


class KubeletUnavailable(Exception):
    """List did not answer: no socket, nothing listening, too slow (DEADLINE_EXCEEDED), or an error status."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Allocation:
    """The devices of one resource the kubelet assigned to one container, ids as the device plugin names them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimedDevice:
    """One device of a DRA resource claim the kubelet prepared for one container.

    `(driver, pool, device)` names it uniquely on the cluster (the kubelet's api.proto); what GPU or chip it is
    only the driver's ResourceSlice says. `share_id` is set for a shared (consumable-capacity) allocation;
    `cdi_devices` are the fully qualified CDI names the driver gave the runtime (`vendor.com/class=name`).
    """

    namespace: str
    pod: str
    container: str
    claim: str
    claim_namespace: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodResourcesList:
    """What one List call answered: device-plugin allocations and, beside them, the devices of DRA claims (empty
    where the kubelet reports none: before Kubernetes 1.34, or with KubeletPodResourcesDynamicResources off)."""

    allocations: tuple[Allocation, ...] = ()
    claimed: tuple[ClaimedDevice, ...] = ()


def allocations(response: Any) -> tuple[Allocation, ...]:
    """Every container's device-plugin devices in a ListPodResourcesResponse (containers without devices left out)."""
    out = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.device_ids:
                    out.append(
                        Allocation(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=devices.resource_name,
                            device_ids=tuple(devices.device_ids),
                        )
                    )
    return tuple(out)


def claimed_devices(response: Any) -> tuple[ClaimedDevice, ...]:
    """Every container's DRA devices in a ListPodResourcesResponse, one per ClaimResource, in the kubelet's order.

    A claim's namespace is the pod's (claims are namespaced); the kubelet fills `claim_namespace`, and an empty
    one is read as the pod's.
    """
    out = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    out.append(
                        ClaimedDevice(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            claim=claim.claim_name,
                            claim_namespace=claim.claim_namespace or pod.namespace,
                            driver=resource.driver_name,
                            pool=resource.pool_name,
                            device=resource.device_name,
                            share_id=resource.share_id if resource.HasField("share_id") else None,
                            cdi_devices=tuple(cdi.name for cdi in resource.cdi_devices),
                        )
                    )
    return tuple(out)


def socket_problem(path: Path) -> tuple[str, str] | None:
    """Why `path` cannot be dialled, as (code, detail): `missing` (or not a socket), `PERMISSION_DENIED` (a
    directory on the way this user may not search); None when it is a socket."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing", f"{path} does not exist"
    except PermissionError as exc:
        return "PERMISSION_DENIED", f"{path}: {exc.strerror or exc}"
    except OSError as exc:
        return "missing", f"{path}: {exc.strerror or exc}"
    return None if stat.S_ISSOCK(mode) else ("missing", f"{path} is not a socket")


class PodResourcesClient:
    """`list()` calls List with a deadline of `timeout` seconds on the socket at `path`."""

    def __init__(self, path: Path, timeout: float) -> None:
        import grpc

        self.path = path
        self.timeout = timeout
        self._grpc: Any = grpc
        self._pb: Any = None  # the generated modules, made when a socket is first there to dial
        self._pb_grpc: Any = None
        self._channel: Any = None
        self._stub: Any = None

    def list(self) -> tuple[Allocation, ...]:
        """The device-plugin devices of every container on the node; raises as `list_all()`."""
        return self.list_all().allocations

    def list_all(self) -> PodResourcesList:
        """The devices of every container on the node, device plugins' and DRA claims'; raises KubeletUnavailable
        (StubsUnavailable where the stubs cannot be made: they are made at the first dial)."""
        problem = socket_problem(self.path)
        if problem is not None:
            self.close()
            raise KubeletUnavailable(*problem)
        if self._stub is None:
            if self._pb is None:
                from jaxmon.sources.kubelet.stubs import stubs

                self._pb, self._pb_grpc = stubs()  # raises StubsUnavailable
            self._channel = self._grpc.insecure_channel(
                f"unix:{self.path.absolute()}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._stub = self._pb_grpc.PodResourcesListerStub(self._channel)
        try:
            response = self._stub.List(self._pb.ListPodResourcesRequest(), timeout=self.timeout)
        except self._grpc.RpcError as exc:
            self.close()
            raise KubeletUnavailable(exc.code().name, exc.details() or "") from None
        return PodResourcesList(allocations(response), claimed_devices(response))

    def close(self) -> None:
        """Close the channel (the next `list()` dials again)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
