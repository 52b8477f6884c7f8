"""The device catalog (jaxmon/catalog/hardware.py): one entry per device kind, every figure with its vendor source;
the peak per JAX device, the nominal link bandwidth per direction, and nothing for a kind it does not know. Its TPU
figures agree with tpu-info's chip table and JAX's own, and with a real v5e chip's memory."""

from __future__ import annotations

import json

import pytest

from jaxmon.catalog.hardware import GPUS, KINDS, LINKS, TPUS, device_peak, lookup, nominal_bandwidth
from jaxmon.families.training import training_families
from jaxmon.training_readings import DeviceTraining, TrainingReading
from tests.helpers import FIXTURES


@pytest.mark.parametrize(
    ("kind", "num_cores", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", None, 989e12),  # H100 SXM
        ("NVIDIA H100 PCIe", None, 756e12),
        ("NVIDIA H100 NVL", None, 835e12),
        ("NVIDIA H200", None, 989e12),
        ("NVIDIA H200 141GB HBM3e", None, 989e12),  # any H200 name: the prefix entry (Levanter misses it)
        ("NVIDIA A100-SXM4-80GB", None, 312e12),
        ("NVIDIA A100 80GB PCIe", None, 312e12),
        ("NVIDIA A100-SXM-80GB", None, 312e12),  # an A100 no link entry names: the family's peak
        ("NVIDIA B200", None, 2250e12),
        ("NVIDIA GB200", None, 2500e12),
        ("TPU v4", 2, 275e12),  # a megacore device: the whole chip
        ("TPU v4", None, 275e12),
        ("TPU v3", 1, 61.5e12),  # two devices per chip
        ("TPU v3", None, 61.5e12),
        ("TPU v2", 1, 22.5e12),
        ("TPU v5 lite", 1, 197e12),
        ("TPU v5e", None, 197e12),
        ("TPU v5", 2, 459e12),
        ("TPU v5p", None, 459e12),
        ("TPU v6 lite", 1, 918e12),
        ("TPU7x", 1, 1153.5e12),  # 2307 per chip, 2 devices
        ("TPU7x", None, 1153.5e12),
    ],
)
def test_a_known_kind_has_its_dense_bf16_peak_per_device(kind: str, num_cores: int | None, peak: float) -> None:
    assert device_peak(kind, num_cores) == pytest.approx(peak)


@pytest.mark.parametrize(
    "kind", ["cpu", "NVIDIA GeForce RTX 4090", "TPU v9", "nvidia h100 80gb hbm3", "", "TPU v4 lite"]
)
def test_an_unknown_kind_has_no_peak_never_a_guess(kind: str) -> None:
    assert lookup(kind) is None and device_peak(kind, None) is None


def test_a_peak_by_dtype_is_the_kinds_where_the_vendor_quotes_one() -> None:
    assert device_peak("NVIDIA H100 80GB HBM3", None, "fp8") == pytest.approx(1979e12)
    assert device_peak("TPU v5 lite", None, "int8") == pytest.approx(394e12)
    assert device_peak("TPU7x", 1, "fp8") == pytest.approx(2307e12)  # 4614 per chip, 2 devices
    assert device_peak("Tesla V100-SXM2-32GB", None) is None  # no bf16 on a V100: no MFU
    assert device_peak("Tesla V100-SXM2-32GB", None, "fp16") == pytest.approx(125e12)
    assert device_peak("TPU v2", None, "fp8") is None


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        ("NVIDIA H100 80GB HBM3", {"nvlink": 450e9, "pcie": 64e9}),  # 900 and 128 GB/s both ways
        ("NVIDIA H100 PCIe", {"nvlink": 300e9, "pcie": 64e9}),
        ("NVIDIA A100-SXM4-80GB", {"nvlink": 300e9, "pcie": 32e9}),
        ("TPU v5 lite", {"ici": 200e9, "dcn": 3.125e9}),  # 400 GBps both ways; 2 x 100 Gbps NICs for 8 chips
        ("TPU v5p", {"ici": 600e9, "dcn": 6.25e9}),  # 50 Gbps DCN per chip, one way
        ("TPU v6 lite", {"ici": 400e9}),  # no DCN figure per chip in the catalog: none exported
        ("cpu", {}),
        ("NVIDIA GeForce RTX 4090", {}),
    ],
)
def test_the_nominal_bandwidth_of_each_link_per_direction(kind: str, want: dict[str, float]) -> None:
    assert nominal_bandwidth(kind) == pytest.approx(want)


def test_the_setting_overrides_or_adds_links_for_every_kind() -> None:
    assert nominal_bandwidth("cpu", (("local", 1e10), ("network", 1.25e9))) == {"local": 1e10, "network": 1.25e9}
    assert nominal_bandwidth("TPU v5 lite", (("dcn", 12.5e9),)) == {"dcn": 12.5e9, "ici": 200e9}
    from jaxmon.collectors.training import TrainingOptions

    config = TrainingOptions(link_bandwidth="local=1e10,network=1.25e9").tracker_config()
    assert config.link_bandwidth == (("local", 1e10), ("network", 1.25e9))
    with pytest.raises(ValueError, match="link_bandwidth"):
        TrainingOptions(link_bandwidth="warp=1e10")


def test_the_family_holds_the_known_links_only() -> None:
    devices = (
        DeviceTraining("tpu", 0, link_bandwidth=nominal_bandwidth("TPU v5 lite")),
        DeviceTraining("cpu", 1, link_bandwidth=nominal_bandwidth("cpu")),
    )
    samples = {
        (s.labels["device"], s.labels["link"]): s.value
        for m in training_families([({"workload": "w"}, TrainingReading(steps_total=1, devices=devices))])
        for s in m.samples
        if s.name == "jaxmon_link_nominal_bandwidth_bytes_per_second"
    }
    assert samples == {("0", "dcn"): 3.125e9, ("0", "ici"): 200e9}


def test_every_entry_is_whole_and_every_figure_names_its_vendor_source() -> None:
    names = [k for entry in KINDS for k in entry.kinds]
    assert len(names) == len(set(names))
    for entry in KINDS:
        assert entry.platform in ("gpu", "tpu") and entry.kinds, entry.name
        assert entry.devices_per_chip in (1, 2) and entry.cores_per_chip in (1, 2), entry.name
        figures = [*entry.peak_flops.values(), *([entry.hbm_bytes] if entry.hbm_bytes else [])]
        for figure in figures:
            assert figure.value > 1e9 and any(v in figure.source for v in ("NVIDIA", "Cloud TPU")), entry.name
        for link in entry.links:
            assert link.kind in LINKS and link.vendor_bytes_per_second > 0, entry.name
            assert any(v in link.source for v in ("NVIDIA", "Cloud TPU")), entry.name
    assert all(e.nvml_names == e.kinds and not e.libtpu_name for e in GPUS)
    assert all(e.libtpu_name and e.pci_device_id and not e.nvml_names for e in TPUS)
    assert lookup("TPU v5 lite") is not None and lookup("TPU v5 lite") is not lookup("TPU v5")


def test_the_tpu_entries_agree_with_tpu_infos_chip_table() -> None:
    """tpu-info (google/cloud-accelerator-diagnostics) names each chip, finds it by its PCI device id, and says its
    HBM (per TensorCore for v2 and v3) and JAX devices per chip."""
    from tpu_info.device import TpuChip

    for chip in TpuChip:
        (entry,) = [e for e in TPUS if e.libtpu_name == chip.value.name]
        assert entry.devices_per_chip == chip.value.devices_per_chip, entry.name
        per_device = entry.libtpu_name in ("v2", "v3")
        assert entry.hbm_bytes is not None
        assert entry.hbm_bytes.value == chip.value.hbm_gib * (1 << 30) * (2 if per_device else 1), entry.name
        subsystem = {"v2": "0x004e", "v3": "0x004f"}.get(entry.libtpu_name, "")
        assert TpuChip.from_pci_device_id(entry.pci_device_id, subsystem) is chip, entry.name


def test_the_tpu_entries_agree_with_jaxs_own_table_from_v4_on() -> None:
    """JAX's Pallas TPU table (per TensorCore): bf16 and int8 peaks and HBM per chip, within 1 % (Google's pages
    round differently: 918 against JAX's 920 TFLOPS for v6e). JAX's v2 and v3 figures (46, 140) are not Google's
    published ones (45, 123): the catalog keeps Google's."""
    from jax._src.pallas.mosaic import tpu_info

    if not hasattr(tpu_info, "chip_version_from_device_kind"):  # jax 0.9 (the floors' run): not yet in JAX's table
        pytest.skip("JAX's Pallas TPU table names chips by device kind from jax 0.10 on")
    for entry in TPUS:
        version = tpu_info.chip_version_from_device_kind(entry.kinds[0])
        assert version is not None, entry.name
        if entry.libtpu_name in ("v2", "v3"):
            continue
        cores = version.num_physical_tensor_cores_per_chip
        jax = tpu_info._get_tpu_info_impl(version, cores)
        assert entry.peak_flops["bf16"].value == pytest.approx(jax.bf16_ops_per_second * cores, rel=0.01)
        if "int8" in entry.peak_flops and jax.int8_ops_per_second:  # 0: "Not Available" in JAX's
            assert entry.peak_flops["int8"].value == pytest.approx(jax.int8_ops_per_second * cores, rel=0.01)
        assert entry.hbm_bytes is not None
        assert entry.hbm_bytes.value == pytest.approx(jax.hbm_capacity_bytes * cores, rel=0.01), entry.name


def test_a_real_v5e_chips_allocator_limit_fits_the_catalogs_hbm() -> None:
    """The real chip's `memory_stats()` (tests/fixtures/tpu-v5e-memory-stages.json): its bytes_limit is the HBM less
    what the runtime keeps, within 2 %."""
    (device,) = json.loads((FIXTURES / "tpu-v5e-memory-stages.json").read_text())["devices"][:1]
    entry = lookup(device["device_kind"])
    assert entry is not None and entry.hbm_bytes is not None
    limit = device["memory_stats"][0]["bytes_limit"]
    assert 0.98 * entry.hbm_bytes.value < limit <= entry.hbm_bytes.value
