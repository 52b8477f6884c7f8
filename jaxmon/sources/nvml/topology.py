"""The link between each two GPUs of this host, from NVML's topology calls (the links of jaxmon.catalog.hardware).

- `nvmlDeviceGetTopologyCommonAncestor(a, b)`: the closest common ancestor of the two GPUs on the PCI tree
  (nvmlGpuTopologyLevel_t: NVML_TOPOLOGY_INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30: the same PCIe host
  bridge or below, `pcie`; NODE 40, SYSTEM 50: across the CPUs' interconnect, `sys`).
- `nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK)`: NVML_P2P_STATUS_OK where the two talk over NVLink
  (directly or through NVSwitch).
- `nvmlDeviceGetNvLinkRemotePciInfo_v2(a, link)`: the PCI bus id at each NVLink's far end (a peer GPU directly
  attached: NVLink without a switch).

A pair is `nvlink` where either NVLink call says so, else as its common ancestor says; None where NVML answers
neither (the link then reads `unknown`, never a guess). Read once per pair: n (n - 1) / 2 calls of each kind, 28
for 8 GPUs. No NVML call is made on the training thread: the caller reads this where it reads NVML.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pynvml

from jaxmon.catalog.hardware import nvml_link
from jaxmon.device_readings import DeviceInfo
from jaxmon.sources.nvml.match import match_devices
from jaxmon.sources.nvml.nvlink import MAX_LINKS


def _bus(text: Any) -> str:
    """A PCI bus id as NVML writes it (bytes or str, `00000000:3B:00.0`), normalised for comparison."""
    value = text.decode() if isinstance(text, bytes) else str(text)
    domain, _, rest = value.strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":")
    return f"{int(domain or '0', 16):08x}:{bus}:{rest}"


def _peers(handle: Any) -> set[str]:
    """The bus ids at the far ends of this GPU's NVLinks (none where NVML does not say)."""
    out: set[str] = set()
    for link in range(MAX_LINKS):
        try:
            out.add(_bus(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                break  # past the GPU's last link
            if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                continue
            raise
    return out


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def gpu_pairs(handles: Mapping[int, Any]) -> dict[frozenset[int], str | None]:
    """The link between each two of these GPUs (NVML index -> handle), by their pair of indices."""
    bus = {i: _bus(pynvml.nvmlDeviceGetPciInfo(h).busId) for i, h in handles.items()}
    peers = {i: _peers(h) for i, h in handles.items()}
    out: dict[frozenset[int], str | None] = {}
    indices = sorted(handles)
    for k, a in enumerate(indices):
        for b in indices[k + 1 :]:
            ancestor = _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            status = _call(pynvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
            p2p = None if status is None else status == pynvml.NVML_P2P_STATUS_OK
            peer = bus[b] in peers[a] or bus[a] in peers[b]
            out[frozenset((a, b))] = nvml_link(ancestor, p2p, peer)
    return out


def by_jax_id(pairs: Mapping[frozenset[int], str | None], jax_ids: Mapping[int, int]) -> dict[frozenset[int], str]:
    """The pairs' links keyed by JAX device ids (jaxmon.sources.nvml.match's certain matches: NVML index -> JAX id);
    a pair with a GPU not matched, or a link NVML did not say, is left out (unknown)."""
    return {
        frozenset(jax_ids[i] for i in pair): link
        for pair, link in pairs.items()
        if link is not None and all(i in jax_ids for i in pair)
    }


def read_gpu_pairs(devices: Sequence[DeviceInfo], environ: Mapping[str, str]) -> dict[frozenset[int], str] | None:
    """This host's GPU pairs by JAX device id, read from NVML once (nvmlInit, the topology calls, nvmlShutdown), or
    None where there is no NVML, fewer than two GPUs, or no certain match of NVML's GPUs to the JAX devices."""
    if sum(d.platform == "gpu" for d in devices) < 2:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        match = match_devices(devices, count, environ)
        if not match.jax_ids:
            return None
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)}
        return by_jax_id(gpu_pairs(handles), match.jax_ids)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
