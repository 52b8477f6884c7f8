"""Which GPU, MIG device or TPU chip a DRA claim's device is: the node's ResourceSlices turned into device identities
(pure).

Dynamic Resource Allocation (`resource.k8s.io/v1`, GA in Kubernetes 1.34) names an allocated device by
`(driver, pool, device)` (the kubelet's `ClaimResource`: jaxmon.sources.kubelet.ClaimedDevice), not by a GPU UUID.
The driver publishes what each device is in ResourceSlices (`spec.driver`, `spec.pool.name`, `spec.devices[].name`
and `spec.devices[].attributes`, each attribute one of `{"string"|"int"|"bool"|"version": value}`; an attribute
name without a domain is in the driver's own, so `uuid` and `gpu.nvidia.com/uuid` are the same).

- NVIDIA's driver (`gpu.nvidia.com`): devices `gpu-0`, `gpu-1`, ... with `type` `gpu`, `uuid` (`GPU-…`), `index`,
  `minor`; MIG devices with `type` `mig`, their own `uuid` (`MIG-…`) and `parentUUID`. A GPU is known by its UUID,
  a MIG device by its MIG UUID: the keys jaxmon.ownership.attribution uses for device-plugin ids (`("uuid", "gpu-…")`,
  `("mig", "mig-…")`), so both paths label the same series.
- TPU drivers (`tpu.google.com`, kubernetes-sigs/dra-driver-google-tpu): one device per chip (`accel0`, or `0`
  on chips bound to vfio), with `index` (an int), `uuid` (`tpu-…`), `tpuGen`, `accelerator`, `topology`,
  `chipCount`. The key is `("tpu", "<index>")` (without `index`, the number the device's name ends with).
  jaxmon.ownership.attribution's rule for TPU chips stays what decides a series' labels (the node's one holder of TPU
  chips), as libtpu's device ids and the node's chip numbers are not known to agree.

A claimed device the slices do not name (the driver has not published it yet, or it is gone), or that they name
without an identity jaxmon knows, is a problem with a reason, never a guess: its holders label nothing.
The slices' JSON is read into `SliceDevice`s by the API source (jaxmon.sources.kubernetes_api: a pool spread over
several slices is read at its highest `spec.pool.generation` only); this module only resolves them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import cached_property

from jaxmon.exchange import GPU_UUID, MIG_UUID, DeviceId, Owner, Owners, device_id
from jaxmon.ownership.attribution import TPU_ANY
from jaxmon.sources.kubelet import ClaimedDevice
from jaxmon.sources.kubernetes_api import DeviceName, SliceDevice

NVIDIA_DRIVERS = ("gpu.nvidia.com",)
TPU_DRIVERS = ("tpu.google.com",)

# The kind of a DRA TPU chip's identity, ("tpu", "<index>"): the driver's chip index, which no other source names.
# GPUs and MIG devices are known by jaxmon.exchange's GPU_UUID and MIG_UUID kinds, as the device plugins' ids are.
DRA_TPU_INDEX = "tpu"

# Why a claimed device has no identity (the `reason` label).
NOT_IN_SLICES = "not_in_slices"  # no slice of the node names (driver, pool, device)
NO_IDENTITY = "no_identity"  # named, but without the attribute that says which GPU or chip it is

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def claim_owner(claimed: ClaimedDevice) -> Owner:
    """The container that holds a device through a DRA claim, the claim kept (`extra`: `("claim", "ns/name")`), which
    no device series carries."""
    claim = ("claim", f"{claimed.namespace}/{claimed.claim}")
    return Owner(claimed.namespace, claimed.pod, claimed.container, (claim,))


@dataclass(frozen=True)
class Unresolved:
    """A claimed device with no identity, and why (NOT_IN_SLICES, NO_IDENTITY)."""

    claimed: ClaimedDevice
    reason: str


@dataclass(frozen=True)
class Resolution:
    """The owners of every device DRA claims on the node, by device identity, and the claimed devices without one.

    `devices` has the shape of jaxmon.ownership.attribution.Attribution.gpus (owners by identity), with the claim in
    each owner (`claim_owner`); `resolved` pairs each claimed device with its identity, in the kubelet's order
    (metrics.KUBERNETES_POD_DEVICE_INFO).
    """

    devices: Mapping[DeviceId, frozenset[Owner]] = field(default_factory=dict)
    resolved: tuple[tuple[ClaimedDevice, DeviceId], ...] = ()
    unresolved: tuple[Unresolved, ...] = ()

    def holders(self, key: DeviceId) -> frozenset[Owner]:
        """The owners of device `key` without their claims (the labels of device-wide series)."""
        return frozenset(replace(o, extra=()) for o in self.devices.get(key, frozenset()))

    @cached_property
    def owners(self) -> Owners:
        """The owner transform's map (jaxmon.ownership.owners): GPUs and MIG devices by UUID; TPU chips, whose DRA
        index no source relates to libtpu's device ids, as the node's TPU chips (`TPU_ANY`, one holder or none), as
        the device plugin's are. Each owner keeps its claim (`extra`), which no device series carries."""
        devices: dict[DeviceId, set[Owner]] = {}
        for key, owners in self.devices.items():
            target = TPU_ANY if key[0] == DRA_TPU_INDEX else key
            devices.setdefault(target, set()).update(owners)
        return Owners(devices={k: frozenset(v) for k, v in devices.items()}, sole=frozenset({TPU_ANY}))


def published_id(
    device: SliceDevice,
    nvidia_drivers: Sequence[str] = NVIDIA_DRIVERS,
    tpu_drivers: Sequence[str] = TPU_DRIVERS,
) -> DeviceId | None:
    """Which GPU, MIG device or TPU chip a published device is; None when its attributes do not say."""
    attrs = device.attributes
    if any(fnmatchcase(device.driver, p) for p in nvidia_drivers):
        uuid = attrs.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            return None
        kind = attrs.get("type")
        if kind == "mig" or uuid.upper().startswith("MIG-"):
            return device_id(MIG_UUID, uuid)
        return device_id(GPU_UUID, uuid)
    if any(fnmatchcase(device.driver, p) for p in tpu_drivers):
        index = attrs.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return (DRA_TPU_INDEX, str(index))
        if m := _TRAILING_NUMBER.search(device.name):
            return (DRA_TPU_INDEX, str(int(m.group(1))))
        return None
    return None


def accelerator_driver(
    driver: str, nvidia_drivers: Sequence[str] = NVIDIA_DRIVERS, tpu_drivers: Sequence[str] = TPU_DRIVERS
) -> bool:
    """Whether `driver` hands out GPUs or TPU chips (other drivers' claims, a NIC's, are not jaxmon's concern)."""
    return any(fnmatchcase(driver, p) for p in (*nvidia_drivers, *tpu_drivers))


def resolve(
    slices: Mapping[DeviceName, SliceDevice],
    claimed: Iterable[ClaimedDevice],
    nvidia_drivers: Sequence[str] = NVIDIA_DRIVERS,
    tpu_drivers: Sequence[str] = TPU_DRIVERS,
) -> Resolution:
    """The owners of each claimed GPU, MIG device and TPU chip by identity (claims of other drivers ignored).

    Several claims on one device (a shared GPU: time-slicing, MPS, `share_id`) give it several owners, as several
    device-plugin replicas of one GPU do.
    """
    devices: dict[DeviceId, set[Owner]] = {}
    resolved: list[tuple[ClaimedDevice, DeviceId]] = []
    unresolved: list[Unresolved] = []
    for c in claimed:
        if not accelerator_driver(c.driver, nvidia_drivers, tpu_drivers):
            continue
        published = slices.get((c.driver, c.pool, c.device))
        if published is None:
            unresolved.append(Unresolved(c, NOT_IN_SLICES))
            continue
        key = published_id(published, nvidia_drivers, tpu_drivers)
        if key is None:
            unresolved.append(Unresolved(c, NO_IDENTITY))
            continue
        devices.setdefault(key, set()).add(claim_owner(c))
        resolved.append((c, key))
    return Resolution({k: frozenset(v) for k, v in devices.items()}, tuple(resolved), tuple(unresolved))


class ProblemCounter:
    """Claimed devices that found no identity, counted once each per reason (`..._problems_total{reason}`).

    A device unresolved at every poll is one problem, not one per poll; one that resolves and later fails again
    (its slice gone) counts again.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._open: set[tuple[ClaimedDevice, str]] = set()

    def observe(self, resolution: Resolution) -> None:
        now = {(u.claimed, u.reason) for u in resolution.unresolved}
        for _, reason in now - self._open:
            self.counts[reason] = self.counts.get(reason, 0) + 1
        self._open = now
