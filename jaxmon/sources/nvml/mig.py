"""MIG: the MIG devices of a GPU in MIG mode, each with its UUID, instance ids, profile, memory and utilization.

Everything here works without privileges. The profile comes from the MIG device's NVML name, which ends in
`MIG <profile>` (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`, the names `nvidia-smi -L` lists): the other route, the GPU
instance's profile info, starts at `nvmlDeviceGetGpuInstanceById`, which needs a privileged user, and jaxmon's image
runs as uid 10401. Per MIG device NVML reports memory; utilization only where the driver supports it for MIG
devices (current drivers answer NOT_SUPPORTED: its series is absent, as for any number NVML does not report).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pynvml

from jaxmon.sources.nvml.calls import ABSENT, Versions, memory, optional
from jaxmon.sources.nvml.readings import MigDevice

_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")


@dataclass(frozen=True)
class MigIdentity:
    """What does not change while a MIG device exists (asked once per MIG UUID)."""

    name: str | None
    profile: str | None
    gpu_instance: int | None
    compute_instance: int | None


def profile_of(name: str | None) -> str | None:
    """`1g.18gb` from `NVIDIA H200 MIG 1g.18gb`; None for a name without a MIG profile."""
    found = _PROFILE.search(name or "")
    return found.group(1) if found else None


def read(
    handle: Any, versions: Versions, known: Mapping[str, MigIdentity]
) -> tuple[bool | None, tuple[MigDevice, ...] | None, dict[str, MigIdentity]]:
    """(MIG mode on, its MIG devices, the identities of the MIG devices seen now). MIG mode is None where the GPU
    or driver has no MIG; the devices are None unless MIG mode is on."""
    mode = optional(lambda: pynvml.nvmlDeviceGetMigMode(handle))
    if mode is None:
        return None, None, {}
    if int(mode[0]) != pynvml.NVML_DEVICE_MIG_ENABLE:
        return False, None, {}
    count = optional(lambda: int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))) or 0
    devices = []
    seen: dict[str, MigIdentity] = {}
    for index in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError as err:
            # No MIG device at this index (NOT_FOUND): the instances need not fill the indexes.
            if err.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT, *ABSENT):
                continue
            raise
        uuid = str(pynvml.nvmlDeviceGetUUID(mig))
        identity = known.get(uuid) or _identity(mig)
        seen[uuid] = identity
        total, used = memory(mig, versions)
        util = optional(partial(pynvml.nvmlDeviceGetUtilizationRates, mig))
        devices.append(
            MigDevice(
                index=index,
                uuid=uuid,
                gpu_instance=identity.gpu_instance,
                compute_instance=identity.compute_instance,
                profile=identity.profile,
                name=identity.name,
                memory_total_bytes=total,
                memory_used_bytes=used,
                duty_cycle_ratio=None if util is None else int(util.gpu) / 100.0,
            )
        )
    return True, tuple(devices), seen


def _identity(mig: Any) -> MigIdentity:
    name = optional(lambda: str(pynvml.nvmlDeviceGetName(mig)))
    return MigIdentity(
        name=name,
        profile=profile_of(name),
        gpu_instance=optional(lambda: int(pynvml.nvmlDeviceGetGpuInstanceId(mig))),
        compute_instance=optional(lambda: int(pynvml.nvmlDeviceGetComputeInstanceId(mig))),
    )
