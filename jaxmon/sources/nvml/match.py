"""Which of NVML's GPUs is which of this process's JAX GPU devices: matched only where the match is certain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jaxmon.device_readings import DeviceInfo


@dataclass(frozen=True)
class DeviceMatch:
    """How NVML's GPUs map to the daemon's JAX GPU devices: `how`, and NVML index -> JAX device id where matched."""

    how: str = "nvml_index"
    jax_ids: Mapping[int, int] = field(default_factory=dict)

    def device(self, index: int) -> int:
        """The `device` label of NVML GPU `index`."""
        return self.jax_ids.get(index, index)


def match_devices(jax: Sequence[DeviceInfo], nvml_count: int, environ: Mapping[str, str]) -> DeviceMatch:
    """Match NVML's GPUs to this process's JAX GPU devices where the match is certain, else by NVML index.

    - only_gpu: one GPU on each side. CUDA_VISIBLE_DEVICES only narrows what CUDA sees of what NVML sees, so
      JAX's one GPU is NVML's one GPU.
    - pci_bus_order: every GPU on each side, in one JAX process, with CUDA_DEVICE_ORDER=PCI_BUS_ID and no
      CUDA_VISIBLE_DEVICES. NVML indexes GPUs in PCI bus order, CUDA then numbers them in PCI bus order too, and
      XLA gives one process's GPUs the ids 0..n-1 in CUDA ordinal order (se_gpu_topology_description.cc).
    Anything else (a subset, CUDA's default fastest-first order, several JAX processes) could be a wrong match,
    which is worse than none.
    """
    gpus = sorted((d for d in jax if d.platform == "gpu"), key=lambda d: d.id)
    if nvml_count == 1 and len(gpus) == 1:
        return DeviceMatch("only_gpu", {0: gpus[0].id})
    if (
        gpus
        and len(gpus) == nvml_count
        and environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        and "CUDA_VISIBLE_DEVICES" not in environ
        and len({d.process_index for d in gpus}) == 1
        and [d.id for d in gpus] == list(range(nvml_count))
    ):
        return DeviceMatch("pci_bus_order", {i: i for i in range(nvml_count)})
    return DeviceMatch()
