"""Each link's nominal bandwidth per device kind, with the vendor source of every figure: what a collective's achieved
bus bandwidth (jaxmon_training_profile_collective_bytes_total over its seconds, nccl-tests' convention) is compared
with, and what the placement advice prices an axis's bytes at.

Per device and per direction, in bytes per second. Vendors quote NVLink, PCIe and TPU ICI as the sum of both
directions (NVIDIA: "NVLink 900 GB/s", "PCIe Gen5 128 GB/s"; Google: "bidirectional ICI bandwidth per chip"):
those are halved here, as nccl-tests compares bus bandwidth with one direction. Network figures (a NIC's Gbps, a
chip's DCN Gbps) are per direction already. A kind or link the table does not hold has no figure: nothing is
exported for it, never a guessed default. Figures per chip are per JAX device for the kinds listed here (one JAX
device per chip: the v5e, v5p (a megacore) and v6e chips, and every GPU).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Nominal:
    """One figure: the device kinds it covers (prefixes of JAX's `device_kind`), the link, the vendor's figure in
    bytes per second, whether the vendor's figure counts both directions, and its source."""

    kinds: tuple[str, ...]
    link: str
    vendor_bytes_per_second: float
    bidirectional: bool
    source: str

    @property
    def per_direction(self) -> float:
        return self.vendor_bytes_per_second / 2 if self.bidirectional else self.vendor_bytes_per_second


GB = 1e9
GBIT = 1e9 / 8
_V100 = ("Tesla V100-SXM2",)
_A100 = ("NVIDIA A100-SXM4",)
_A100_PCIE = ("NVIDIA A100-PCIE", "NVIDIA A100 80GB PCIe")
_H100_SXM = ("NVIDIA H100 80GB HBM3",)
_H100_PCIE = ("NVIDIA H100 PCIe",)
_H200 = ("NVIDIA H200",)
_B200 = ("NVIDIA B200",)

TABLE = (
    Nominal(_V100, "nvlink", 300 * GB, True, "NVIDIA V100 datasheet: NVLink 2 (SXM2) 300 GB/s"),
    Nominal(_V100, "pcie", 32 * GB, True, "NVIDIA V100 datasheet: PCIe Gen3 32 GB/s"),
    Nominal(_A100, "nvlink", 600 * GB, True, "NVIDIA A100 datasheet: NVLink 3 (SXM4) 600 GB/s"),
    Nominal(_A100 + _A100_PCIE, "pcie", 64 * GB, True, "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s"),
    Nominal(_A100_PCIE, "nvlink", 600 * GB, True, "NVIDIA A100 datasheet: PCIe card, NVLink bridge 600 GB/s"),
    Nominal(_H100_SXM, "nvlink", 900 * GB, True, "NVIDIA H100 datasheet: NVLink 4 (SXM5) 900 GB/s"),
    Nominal(_H100_SXM + _H100_PCIE, "pcie", 128 * GB, True, "NVIDIA H100 datasheet: PCIe Gen5 128 GB/s"),
    Nominal(_H100_PCIE, "nvlink", 600 * GB, True, "NVIDIA H100 PCIe product brief: NVLink bridge 600 GB/s"),
    Nominal(_H200, "nvlink", 900 * GB, True, "NVIDIA H200 datasheet: NVLink 900 GB/s"),
    Nominal(_H200, "pcie", 128 * GB, True, "NVIDIA H200 datasheet: PCIe Gen5 128 GB/s"),
    Nominal(_B200, "nvlink", 1800 * GB, True, "NVIDIA HGX B200 datasheet: NVLink 5 1.8 TB/s per GPU"),
    Nominal(
        ("TPU v5 lite", "TPU v5e"),
        "ici",
        400 * GB,
        True,
        "Cloud TPU v5e system architecture: bidirectional ICI bandwidth per chip 400 GBps",
    ),
    Nominal(
        ("TPU v5 lite", "TPU v5e"),
        "dcn",
        200 * GBIT / 8,
        False,
        "Cloud TPU v5e system architecture: per-host NIC 2 x 100 Gbps over 8 chips per host",
    ),
    Nominal(
        ("TPU v5p", "TPU v5"),
        "ici",
        1200 * GB,
        True,
        "Cloud TPU v5p system architecture: bidirectional ICI bandwidth per chip 1200 GBps",
    ),
    Nominal(
        ("TPU v5p", "TPU v5"),
        "dcn",
        50 * GBIT,
        False,
        "Cloud TPU v5p system architecture: DCN bandwidth per chip 50 Gbps",
    ),
    Nominal(
        ("TPU v6 lite", "TPU v6e"),
        "ici",
        800 * GB,
        True,
        "Cloud TPU v6e system architecture: bidirectional ICI bandwidth per chip 800 GBps",
    ),
)


def per_link(device_kind: str, overrides: Iterable[tuple[str, float]] = ()) -> dict[str, float]:
    """Each link's nominal bandwidth per direction (bytes/s) for `device_kind`: for each link, the row whose kind is
    the longest prefix of it; {} for a kind the table does not know. `overrides` (collector.training.link_bandwidth)
    replace or add links, for every kind. Cached per (kind, overrides): the tracker asks at every poll."""
    return dict(_per_link(device_kind, tuple(overrides)))


@functools.lru_cache(maxsize=64)
def _per_link(device_kind: str, overrides: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
    best: dict[str, tuple[int, float]] = {link: (1 << 30, value) for link, value in overrides if value > 0}
    for row in TABLE:
        for kind in row.kinds:
            if device_kind.startswith(kind) and len(kind) > best.get(row.link, (-1, 0.0))[0]:
                best[row.link] = (len(kind), row.per_direction)
    return tuple((link, value) for link, (_, value) in sorted(best.items()))
