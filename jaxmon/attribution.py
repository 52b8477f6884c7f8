"""Which pod holds which accelerator: the kubelet's allocations turned into the labels of device-wide series (pure).

Device ids are the device plugins' (docs/deploy.md, "Pod attribution"):

- GPUs (`nvidia.com/gpu`, `nvidia.com/mig-*`, or what `--collector.kubernetes.gpu-resources` lists): a GPU UUID
  (`GPU-…`, NVIDIA's device plugin by default), `nvidiaN` (N the GPU's minor number, /dev/nvidiaN: device-name ids,
  GKE), a MIG device UUID (`MIG-…`). A time-sliced GPU is offered as replicas, `GPU-…::N` (NVIDIA's plugin) or
  `nvidiaN/vgpuM` (GKE): the same GPU, held by every pod that got one of its replicas. GKE's MIG partitions
  (`nvidiaN/giM`) name no MIG UUID, so no series matches them.
- TPU chips (`google.com/tpu`): the device plugin's ids name chips of the node, and libtpu's runtime metrics name
  devices by libtpu's `device-id`; nothing published relates the two numberings (device-ids need not be 0..n-1),
  and a wrong match is worse than none. What is certain: one libtpu service is one process's, and that process
  holds the chips it reports. So a TPU device carries the labels of the one container on the node that holds TPU
  chips, and none where several do.

Several holders of one device (a time-sliced GPU) give one label set, each label the sorted, distinct values of
the holders joined by commas (no Kubernetes name holds a comma): one series per device, so sums over pods or
namespaces count the device once. `jaxmon_kubernetes_pod_device_info` lists each holder on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from jaxmon.sources.kubelet import Allocation

GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*")
TPU_RESOURCES = ("google.com/tpu",)

_UUID = re.compile(r"^(GPU-[0-9A-Fa-f-]+)(?:::\d+)?$")
_MIG = re.compile(r"^(MIG-[^:]+)(?:::\d+)?$")
_MINOR = re.compile(r"^nvidia(\d+)(?:/vgpu\d+)?(?:::\d+)?$")

# What a GPU series is looked up by: ("uuid", "gpu-…"), ("mig", "mig-…") or ("minor", "3").
GpuKey = tuple[str, str]


@dataclass(frozen=True, order=True)
class Holder:
    """A container that holds a device."""

    namespace: str
    pod: str
    container: str


def gpu_key(device_id: str) -> GpuKey | None:
    """The GPU (or MIG device) a device plugin's id names, replica suffixes dropped; None when it names none."""
    if m := _UUID.match(device_id):
        return ("uuid", m.group(1).lower())
    if m := _MIG.match(device_id):
        return ("mig", m.group(1).lower())
    if m := _MINOR.match(device_id):
        return ("minor", str(int(m.group(1))))
    return None


def matches(resource: str, patterns: Sequence[str]) -> bool:
    """Whether `resource` is one of `patterns` (shell-style: `nvidia.com/mig-*`)."""
    return any(fnmatchcase(resource, pattern) for pattern in patterns)


def labels(holders: Iterable[Holder]) -> dict[str, str]:
    """`namespace`, `pod` and `container` of the holders of one device; {} for none."""
    found = sorted(set(holders))
    if not found:
        return {}
    return {
        "namespace": ",".join(sorted({h.namespace for h in found})),
        "pod": ",".join(sorted({h.pod for h in found})),
        "container": ",".join(sorted({h.container for h in found})),
    }


@dataclass(frozen=True)
class Attribution:
    """The holders of every GPU, MIG device and TPU chip on the node (the exchange's DevicePods)."""

    gpus: Mapping[GpuKey, frozenset[Holder]] = field(default_factory=dict)
    tpu_holders: frozenset[Holder] = frozenset()

    def gpu(self, uuid: str | None, minor_number: int | None) -> dict[str, str]:
        """The labels of a whole GPU, by its UUID or its minor number; {} when no pod holds it."""
        holders: set[Holder] = set()
        if uuid is not None:
            holders |= self.gpus.get(("uuid", uuid.lower()), frozenset())
        if minor_number is not None:
            holders |= self.gpus.get(("minor", str(minor_number)), frozenset())
        return labels(holders)

    def mig(self, uuid: str) -> dict[str, str]:
        """The labels of a MIG device, by its UUID (`MIG-…`); {} when no pod holds it."""
        return labels(self.gpus.get(("mig", uuid.lower()), frozenset()))

    def tpu(self, device: int) -> dict[str, str]:
        """The labels of libtpu device `device`: the one container on the node holding TPU chips, else {}."""
        return self.tpu_host()

    def tpu_host(self) -> dict[str, str]:
        """The labels of the node's libtpu service itself (it belongs to the process holding the chips): the one
        container holding TPU chips, else {}."""
        return labels(self.tpu_holders) if len(self.tpu_holders) == 1 else {}


def attribute(
    found: Iterable[Allocation],
    gpu_resources: Sequence[str] = GPU_RESOURCES,
    tpu_resources: Sequence[str] = TPU_RESOURCES,
) -> Attribution:
    """The holders of each device among the allocations of the GPU and TPU resources (others are ignored)."""
    gpus: dict[GpuKey, set[Holder]] = {}
    tpu: set[Holder] = set()
    for a in found:
        holder = Holder(a.namespace, a.pod, a.container)
        if matches(a.resource, gpu_resources):
            for device_id in a.device_ids:
                key = gpu_key(device_id)
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
    """The allocations of the GPU and TPU resources, in a stable order (jaxmon_kubernetes_pod_device_info)."""
    kept = [a for a in found if matches(a.resource, gpu_resources) or matches(a.resource, tpu_resources)]
    return tuple(sorted(kept, key=lambda a: (a.namespace, a.pod, a.container, a.resource, a.device_ids)))
