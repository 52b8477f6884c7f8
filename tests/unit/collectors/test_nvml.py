"""The nvml collector without NVML: its flags, and how NVML's GPUs are matched to JAX's devices.

Everything that reads NVML goes through the fake libnvidia-ml.so.1, which gcc builds:
tests/e2e/collectors/test_nvml.py.
"""

from __future__ import annotations

from jaxmon.app import default_settings, load_settings
from jaxmon.collectors.nvml import DeviceMatch, NvmlOptions, match_devices
from jaxmon.model import DeviceInfo


def jax_gpus(*ids: int, process_index: int = 0) -> list[DeviceInfo]:
    return [DeviceInfo(i, "gpu", "NVIDIA H100 80GB HBM3", process_index=process_index) for i in ids]


def test_the_collector_is_auto_by_default_and_the_flags_set_it() -> None:
    assert default_settings().collector_options("nvml").enabled == "auto"
    assert load_settings(["--collector.nvml"]).collector_options("nvml").enabled is True
    assert load_settings(["--no-collector.nvml"]).collector_options("nvml").enabled is False
    options = load_settings(["--collector.nvml.xid-wait", "0.2"]).collector_options("nvml")
    assert isinstance(options, NvmlOptions) and options.xid_wait == 0.2


def test_nvml_gpus_are_matched_to_jax_devices_only_where_that_is_certain() -> None:
    pci = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    cpu = [DeviceInfo(i, "cpu", "cpu") for i in range(8)]
    assert match_devices(cpu, 8, pci) == DeviceMatch("nvml_index", {})
    # One GPU on each side: the same GPU whatever CUDA_VISIBLE_DEVICES says.
    assert match_devices(jax_gpus(0), 1, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == DeviceMatch("only_gpu", {0: 0})
    assert match_devices([*cpu, *jax_gpus(0)], 1, {}) == DeviceMatch("only_gpu", {0: 0})
    # Every GPU, one process, PCI bus order on both sides.
    assert match_devices(jax_gpus(0, 1, 2, 3), 4, pci) == DeviceMatch("pci_bus_order", {0: 0, 1: 1, 2: 2, 3: 3})
    # CUDA's default order (fastest first), a narrowed set, a subset, or other ids: not certain.
    assert match_devices(jax_gpus(0, 1, 2, 3), 4, {}).how == "nvml_index"
    assert match_devices(jax_gpus(0, 1, 2, 3), 4, {**pci, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}).how == "nvml_index"
    assert match_devices(jax_gpus(0, 1), 4, pci).how == "nvml_index"
    assert match_devices(jax_gpus(4, 5, 6, 7, process_index=1), 4, pci).how == "nvml_index"
    assert match_devices(jax_gpus(0), 2, pci).how == "nvml_index"
