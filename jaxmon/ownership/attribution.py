"""Which pod holds which accelerator: the kubelet's device-plugin allocations turned into `Owners` (pure), the map
the owner transform (jaxmon.ownership.owners) labels every series of a held device with.

Device ids are the device plugins' (docs/deploy.md, "Pod attribution"):

- GPUs (`nvidia.com/gpu`, `nvidia.com/mig-*`, or what `--collector.kubernetes.gpu-resources` lists): a GPU UUID
  (`GPU-…`, NVIDIA's device plugin by default), `nvidiaN` (N the GPU's minor number, /dev/nvidiaN: device-name ids,
  GKE), a MIG device UUID (`MIG-…`). A time-sliced GPU is offered as replicas, `GPU-…::N` (NVIDIA's plugin) or
  `nvidiaN/vgpuM` (GKE): the same GPU, held by every pod that got one of its replicas. GKE's MIG partitions
  (`nvidiaN/giM`) name no MIG UUID, so no series matches them.
- TPU chips (`google.com/tpu`): the device plugin's ids name chips of the node, and libtpu's runtime metrics name
  devices by libtpu's `device-id`; nothing published relates the two numberings (device-ids need not be 0..n-1),
  and a wrong match is worse than none. What is certain: one libtpu service is one process's, and that process
  holds the chips it reports. So the holders of TPU chips are the owners of `TPU_NODE` (any chip of the node), a
  `sole` identity: a TPU device carries the labels of the one container on the node that holds TPU chips, and none
  where several do.

Several holders of one device (a time-sliced GPU) give one label set, each label the sorted, distinct values of
the holders joined by commas (jaxmon.ownership.owners): one series per device, so sums over pods or namespaces count the
device once. The kubelet's device info (metrics.KUBERNETES_POD_DEVICE_INFO) lists each holder on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cached_property

from jaxmon.exchange import GPU_MINOR, GPU_UUID, MIG_UUID, TPU_DEVICE, TPU_NODE, DeviceId, Owner, Owners, device_id
from jaxmon.sources.kubelet import Allocation

GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*")
TPU_RESOURCES = ("google.com/tpu",)

_UUID = re.compile(r"^(GPU-[0-9A-Fa-f-]+)(?:::\d+)?$")
_MIG = re.compile(r"^(MIG-[^:]+)(?:::\d+)?$")
_MINOR = re.compile(r"^nvidia(\d+)(?:/vgpu\d+)?(?:::\d+)?$")

# The identity every TPU chip of the node has for the kubelet's allocations (the tpu collector gives its series it).
TPU_ANY = (TPU_NODE, "")


def gpu_key(plugin_id: str) -> DeviceId | None:
    """The identity of the GPU (or MIG device) a device plugin's id names, replica suffixes dropped ("uuid", "mig"
    or "minor": jaxmon.exchange's kinds); None when it names none."""
    if m := _UUID.match(plugin_id):
        return device_id(GPU_UUID, m.group(1))
    if m := _MIG.match(plugin_id):
        return device_id(MIG_UUID, m.group(1))
    if m := _MINOR.match(plugin_id):
        return (GPU_MINOR, str(int(m.group(1))))
    return None


def matches(resource: str, patterns: Sequence[str]) -> bool:
    """Whether `resource` is one of `patterns` (shell-style: `nvidia.com/mig-*`)."""
    return any(fnmatchcase(resource, pattern) for pattern in patterns)


@dataclass(frozen=True)
class Attribution:
    """The holders of every GPU, MIG device and TPU chip on the node, and the same as the owner transform's map
    (`owners`, what the kubernetes collector offers); the lookups below answer as the transform labels series."""

    gpus: Mapping[DeviceId, frozenset[Owner]] = field(default_factory=dict)
    tpu_holders: frozenset[Owner] = frozenset()

    @cached_property
    def owners(self) -> Owners:
        """The owners of each device identity: GPUs and MIG devices by their ids, the node's TPU chips as one."""
        devices: dict[DeviceId, frozenset[Owner]] = dict(self.gpus)
        if self.tpu_holders:
            devices[TPU_ANY] = self.tpu_holders
        return Owners(devices=devices, sole=frozenset({TPU_ANY}))

    def gpu(self, uuid: str | None, minor_number: int | None) -> dict[str, str]:
        """The labels of a whole GPU, by its UUID or its minor number; {} when no pod holds it."""
        ids = [] if uuid is None else [device_id(GPU_UUID, uuid)]
        if minor_number is not None:
            ids.append((GPU_MINOR, str(minor_number)))
        return self.owners.labels(ids)

    def mig(self, uuid: str) -> dict[str, str]:
        """The labels of a MIG device, by its UUID (`MIG-…`); {} when no pod holds it."""
        return self.owners.labels([device_id(MIG_UUID, uuid)])

    def tpu(self, device: int) -> dict[str, str]:
        """The labels of libtpu device `device`: the one container on the node holding TPU chips, else {}."""
        return self.owners.labels([(TPU_DEVICE, str(device)), TPU_ANY])

    def tpu_host(self) -> dict[str, str]:
        """The labels of the node's libtpu service itself (it belongs to the process holding the chips): the one
        container holding TPU chips, else {}."""
        return self.owners.labels([TPU_ANY])


def attribute(
    found: Iterable[Allocation],
    gpu_resources: Sequence[str] = GPU_RESOURCES,
    tpu_resources: Sequence[str] = TPU_RESOURCES,
) -> Attribution:
    """The holders of each device among the allocations of the GPU and TPU resources (others are ignored)."""
    gpus: dict[DeviceId, set[Owner]] = {}
    tpu: set[Owner] = set()
    for a in found:
        holder = Owner(a.namespace, a.pod, a.container)
        if matches(a.resource, gpu_resources):
            for plugin_id in a.device_ids:
                key = gpu_key(plugin_id)
                if key is not None:
                    gpus.setdefault(key, set()).add(holder)
        elif matches(a.resource, tpu_resources):
            tpu.add(holder)
    return Attribution({k: frozenset(v) for k, v in gpus.items()}, frozenset(tpu))


def accelerators(
    found: Iterable[Allocation],
    gpu_resources: Sequence[str] = GPU_RESOURCES,
    tpu_resources: Sequence[str] = TPU_RESOURCES,
) -> tuple[Allocation, ...]:
    """The allocations of the GPU and TPU resources, in a stable order (metrics.KUBERNETES_POD_DEVICE_INFO)."""
    kept = [a for a in found if matches(a.resource, gpu_resources) or matches(a.resource, tpu_resources)]
    return tuple(sorted(kept, key=lambda a: (a.namespace, a.pod, a.container, a.resource, a.device_ids)))
