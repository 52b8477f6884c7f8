"""The peak table: dense bf16 per JAX device, by device kind and TensorCores; unknown kinds get nothing."""

from __future__ import annotations

import pytest

from jaxmon.training.peaks import TABLE, device_peak, lookup


@pytest.mark.parametrize(
    ("kind", "num_cores", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", None, 989e12),  # H100 SXM
        ("NVIDIA H100 PCIe", None, 756e12),
        ("NVIDIA H100 NVL", None, 835e12),
        ("NVIDIA H200", None, 989e12),
        ("NVIDIA H200 141GB HBM3e", None, 989e12),  # any H200 name: the prefix row (Levanter misses it)
        ("NVIDIA A100-SXM4-80GB", None, 312e12),
        ("NVIDIA A100 80GB PCIe", None, 312e12),
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


@pytest.mark.parametrize("kind", ["cpu", "NVIDIA GeForce RTX 4090", "TPU v9", "nvidia h100 80gb hbm3", ""])
def test_an_unknown_kind_has_no_peak_never_a_guess(kind: str) -> None:
    assert lookup(kind) is None and device_peak(kind, None) is None


def test_exact_names_win_over_prefixes_and_every_row_names_its_source() -> None:
    assert lookup("TPU v5 lite") is not None and lookup("TPU v5 lite") is not lookup("TPU v5")
    assert all(row.source and row.chip_flops > 1e12 for row in TABLE)
    names = [k for row in TABLE for k in row.kinds]
    assert len(names) == len(set(names))
