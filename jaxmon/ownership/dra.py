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
A pool spread over several slices is read at its highest `spec.pool.generation` only (older slices are stale, as
the API says).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Any

from jaxmon.ownership.attribution import TPU_ANY, Holder
from jaxmon.ownership.owners import Owner, Owners
from jaxmon.sources.kubelet import ClaimedDevice

NVIDIA_DRIVERS = ("gpu.nvidia.com",)
TPU_DRIVERS = ("tpu.google.com",)

# What a device is known by: ("uuid", "gpu-…"), ("mig", "mig-…") (as jaxmon.ownership.attribution.GpuKey) or ("tpu",
# "3").
DeviceKey = tuple[str, str]
# How DRA names a device: (driver, pool, device).
DeviceName = tuple[str, str, str]
AttributeValue = str | int | bool

# Why a claimed device has no identity (the `reason` label).
NOT_IN_SLICES = "not_in_slices"  # no slice of the node names (driver, pool, device)
NO_IDENTITY = "no_identity"  # named, but without the attribute that says which GPU or chip it is

_TRAILING_NUMBER = re.compile(r"(\d+)$")


class SliceError(ValueError):
    """A ResourceSlice that is not one (a field missing or of the wrong type), named with what is wrong."""


@dataclass(frozen=True)
class SliceDevice:
    """One device a ResourceSlice publishes: its name and attributes (names without the driver's domain)."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)

    @property
    def key(self) -> DeviceName:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True, order=True)
class ClaimHolder:
    """A container that holds a device through a DRA claim: the device-plugin path's Holder, plus the claim."""

    namespace: str
    pod: str
    container: str
    claim: str

    @property
    def holder(self) -> Holder:
        """The same container as jaxmon.ownership.attribution names holders (the labels of device-wide series)."""
        return Holder(self.namespace, self.pod, self.container)


@dataclass(frozen=True)
class Unresolved:
    """A claimed device with no identity, and why (NOT_IN_SLICES, NO_IDENTITY)."""

    claimed: ClaimedDevice
    reason: str


@dataclass(frozen=True)
class Resolution:
    """The holders of every device DRA claims on the node, by device identity, and the claimed devices without one.

    `devices` has the shape of jaxmon.ownership.attribution.Attribution.gpus (holders by key), with the claim in each
    holder; `resolved` pairs each claimed device with its key, in the kubelet's order
    (jaxmon_kubernetes_pod_device_info).
    """

    devices: Mapping[DeviceKey, frozenset[ClaimHolder]] = field(default_factory=dict)
    resolved: tuple[tuple[ClaimedDevice, DeviceKey], ...] = ()
    unresolved: tuple[Unresolved, ...] = ()

    def holders(self, key: DeviceKey) -> frozenset[Holder]:
        """The holders of device `key` as jaxmon.ownership.attribution.Holder (claims dropped), for
        attribution.labels()."""
        return frozenset(h.holder for h in self.devices.get(key, frozenset()))

    @cached_property
    def owners(self) -> Owners:
        """The owner transform's map (jaxmon.ownership.owners): GPUs and MIG devices by UUID; TPU chips, whose DRA index
        no source relates to libtpu's device ids, as the node's TPU chips (`TPU_ANY`, one holder or none), as the
        device plugin's are. Each owner keeps its claim (`extra`), which no device series carries."""
        devices: dict[tuple[str, str], set[Owner]] = {}
        for key, holders in self.devices.items():
            target = TPU_ANY if key[0] == "tpu" else key
            found = devices.setdefault(target, set())
            found |= {Owner(h.namespace, h.pod, h.container, (("claim", f"{h.namespace}/{h.claim}"),)) for h in holders}
        return Owners(devices={k: frozenset(v) for k, v in devices.items()}, sole=frozenset({TPU_ANY}))


def _attribute(name: str, value: Any, where: str) -> tuple[str, AttributeValue] | None:
    """One attribute as (name, value); None for a type jaxmon does not read (a future one)."""
    if not isinstance(value, dict):
        raise SliceError(f"{where}: attribute {name!r} is {type(value).__name__}, not an object")
    for kind, types in (("string", str), ("version", str), ("bool", bool), ("int", int)):
        if kind in value:
            got = value[kind]
            if not isinstance(got, types) or (kind == "int" and isinstance(got, bool)):
                raise SliceError(f"{where}: attribute {name!r}: {kind} is {got!r}")
            return name, got
    return None


def slice_devices(item: Mapping[str, Any]) -> tuple[int, tuple[SliceDevice, ...]]:
    """The pool generation and devices of one ResourceSlice (resource.k8s.io/v1 JSON); raises SliceError."""
    name = (item.get("metadata") or {}).get("name", "?") if isinstance(item, Mapping) else "?"
    where = f"ResourceSlice {name}"
    spec = item.get("spec") if isinstance(item, Mapping) else None
    if not isinstance(spec, Mapping):
        raise SliceError(f"{where}: no spec")
    driver, pool = spec.get("driver"), spec.get("pool")
    if not isinstance(driver, str) or not driver:
        raise SliceError(f"{where}: spec.driver is {driver!r}")
    if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
        raise SliceError(f"{where}: spec.pool.name missing")
    generation = pool.get("generation", 0)
    if not isinstance(generation, int):
        raise SliceError(f"{where}: spec.pool.generation is {generation!r}")
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        raise SliceError(f"{where}: spec.devices is {type(devices).__name__}, not a list")
    prefix = driver + "/"
    out = []
    for device in devices:
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            raise SliceError(f"{where}: a device without a name")
        attributes: dict[str, AttributeValue] = {}
        raw = device.get("attributes") or {}
        if not isinstance(raw, Mapping):
            raise SliceError(f"{where}: device {device['name']}: attributes are not an object")
        for attr, value in raw.items():
            read = _attribute(attr, value, f"{where}: device {device['name']}")
            if read is not None:
                # An unqualified name is in the driver's domain: `uuid` is `gpu.nvidia.com/uuid`.
                attributes[attr.removeprefix(prefix)] = read[1]
        out.append(SliceDevice(driver, pool["name"], device["name"], attributes))
    return generation, tuple(out)


def index_slices(items: Iterable[Mapping[str, Any]]) -> dict[DeviceName, SliceDevice]:
    """The devices of the slices by (driver, pool, device), each pool at its highest generation; raises SliceError."""
    pools: dict[tuple[str, str], tuple[int, list[SliceDevice]]] = {}
    for item in items:
        generation, devices = slice_devices(item)
        spec = item["spec"]
        pool = (spec["driver"], spec["pool"]["name"])
        held = pools.get(pool)
        if held is None or generation > held[0]:
            pools[pool] = (generation, list(devices))
        elif generation == held[0]:
            held[1].extend(devices)
    return {d.key: d for _, devices in pools.values() for d in devices}


def identity(
    device: SliceDevice,
    nvidia_drivers: Sequence[str] = NVIDIA_DRIVERS,
    tpu_drivers: Sequence[str] = TPU_DRIVERS,
) -> DeviceKey | None:
    """Which GPU, MIG device or TPU chip a published device is; None when its attributes do not say."""
    attrs = device.attributes
    if any(fnmatchcase(device.driver, p) for p in nvidia_drivers):
        uuid = attrs.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            return None
        kind = attrs.get("type")
        if kind == "mig" or uuid.upper().startswith("MIG-"):
            return ("mig", uuid.lower())
        return ("uuid", uuid.lower())
    if any(fnmatchcase(device.driver, p) for p in tpu_drivers):
        index = attrs.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return ("tpu", str(index))
        if m := _TRAILING_NUMBER.search(device.name):
            return ("tpu", str(int(m.group(1))))
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
    """The holders of each claimed GPU, MIG device and TPU chip by identity (claims of other drivers ignored).

    Several claims on one device (a shared GPU: time-slicing, MPS, `share_id`) give it several holders, as several
    device-plugin replicas of one GPU do.
    """
    devices: dict[DeviceKey, set[ClaimHolder]] = {}
    resolved: list[tuple[ClaimedDevice, DeviceKey]] = []
    unresolved: list[Unresolved] = []
    for c in claimed:
        if not accelerator_driver(c.driver, nvidia_drivers, tpu_drivers):
            continue
        published = slices.get((c.driver, c.pool, c.device))
        if published is None:
            unresolved.append(Unresolved(c, NOT_IN_SLICES))
            continue
        key = identity(published, nvidia_drivers, tpu_drivers)
        if key is None:
            unresolved.append(Unresolved(c, NO_IDENTITY))
            continue
        devices.setdefault(key, set()).add(ClaimHolder(c.namespace, c.pod, c.container, c.claim))
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
