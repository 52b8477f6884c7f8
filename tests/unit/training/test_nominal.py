"""The nominal link table: per direction, by device kind, each figure with its vendor source; nothing for a kind or
link it does not know."""

from __future__ import annotations

import pytest

from jaxmon.families.training import training_families
from jaxmon.training.nominal import TABLE, per_link
from jaxmon.training.reading import DeviceTraining, TrainingReading


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        ("NVIDIA H100 80GB HBM3", {"nvlink": 450e9, "pcie": 64e9}),  # 900 and 128 GB/s both ways
        ("NVIDIA H100 PCIe", {"nvlink": 300e9, "pcie": 64e9}),
        ("NVIDIA A100-SXM4-80GB", {"nvlink": 300e9, "pcie": 32e9}),
        ("TPU v5 lite", {"ici": 200e9, "dcn": 3.125e9}),  # 400 GBps both ways; 2 x 100 Gbps NICs for 8 chips
        ("TPU v5p", {"ici": 600e9, "dcn": 6.25e9}),  # 50 Gbps DCN per chip, one way
        ("TPU v6 lite", {"ici": 400e9}),  # no DCN figure per chip in the table: none exported
        ("cpu", {}),
        ("NVIDIA GeForce RTX 4090", {}),
    ],
)
def test_per_link(kind: str, want: dict[str, float]) -> None:
    assert per_link(kind) == pytest.approx(want)


def test_the_setting_overrides_or_adds_links_for_every_kind() -> None:
    assert per_link("cpu", (("local", 1e10), ("network", 1.25e9))) == {"local": 1e10, "network": 1.25e9}
    assert per_link("TPU v5 lite", (("dcn", 12.5e9),)) == {"dcn": 12.5e9, "ici": 200e9}
    from jaxmon.collectors.training import TrainingOptions

    config = TrainingOptions(link_bandwidth="local=1e10,network=1.25e9").tracker_config()
    assert config.link_bandwidth == (("local", 1e10), ("network", 1.25e9))
    with pytest.raises(ValueError, match="link_bandwidth"):
        TrainingOptions(link_bandwidth="warp=1e10")


def test_every_figure_names_its_vendor_source() -> None:
    for row in TABLE:
        assert row.source and any(v in row.source for v in ("NVIDIA", "Cloud TPU")), row
        assert row.link in {"nvlink", "pcie", "ici", "dcn"} and row.vendor_bytes_per_second > 0, row


def test_the_family_holds_the_known_links_only() -> None:
    devices = (
        DeviceTraining("tpu", 0, link_bandwidth=per_link("TPU v5 lite")),
        DeviceTraining("cpu", 1, link_bandwidth=per_link("cpu")),
    )
    samples = {
        (s.labels["device"], s.labels["link"]): s.value
        for m in training_families([({"workload": "w"}, TrainingReading(steps_total=1, devices=devices))])
        for s in m.samples
        if s.name == "jaxmon_link_nominal_bandwidth_bytes_per_second"
    }
    assert samples == {("0", "dcn"): 3.125e9, ("0", "ici"): 200e9}
