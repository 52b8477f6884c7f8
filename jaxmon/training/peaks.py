"""Dense bf16 peak FLOP/s per JAX device, by `device_kind`: the denominator of MFU and HFU.

Dense figures only: vendor sheets quote sparse ones (2x) beside them, and MFU against a sparse peak is half the
truth. Per JAX device, not per chip: a TPU v2, v3 or 7x chip is two JAX devices (one TensorCore each), a v4 or v5p
chip is one (a megacore of two), so a chip's figure is split by `num_cores` (JAX's own table,
jax/_src/tpu_info.py, is per TensorCore times device.num_cores). An unknown kind has no peak: no MFU, never a
guessed default (Levanter never maps "NVIDIA H200"; torchtitan falls back to an A100's figure for any GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxmon.device_readings import DeviceInfo


@dataclass(frozen=True)
class Peak:
    """One row: the device kinds it covers, the chip's dense bf16 FLOP/s, its TensorCores, how many JAX devices it
    is by default, and where the figure comes from."""

    kinds: tuple[str, ...]
    prefix: bool
    chip_flops: float
    source: str
    cores_per_chip: int = 1
    devices_per_chip: int = 1


TABLE = (
    Peak(("NVIDIA A100",), True, 312e12, "A100 datasheet (SXM4 and PCIe, 40 and 80 GB): BF16 tensor core, dense"),
    Peak(("NVIDIA H100 80GB HBM3",), False, 989e12, "H100 SXM5 datasheet: BF16 tensor core 1979 T sparse / 2"),
    Peak(("NVIDIA H100 PCIe",), False, 756e12, "H100 PCIe datasheet: BF16 1513 T sparse / 2"),
    Peak(("NVIDIA H100 NVL",), False, 835e12, "H100 NVL datasheet: BF16 1671 T sparse / 2"),
    Peak(("NVIDIA H200",), True, 989e12, "H200 SXM datasheet: BF16 1979 T sparse / 2"),
    Peak(("NVIDIA B200",), True, 2250e12, "DGX B200 datasheet: 18 PFLOP/s dense FP16/BF16 / 8 GPUs"),
    Peak(("NVIDIA GB200",), True, 2500e12, "GB200 NVL72 datasheet: 180 PFLOP/s dense BF16 / 72 GPUs"),
    Peak(("TPU v2",), False, 45e12, "Cloud TPU v2: 45 TFLOP/s bf16 per chip, 2 TensorCores, 2 devices", 2, 2),
    Peak(("TPU v3",), False, 123e12, "Cloud TPU v3: 123 TFLOP/s bf16 per chip, 2 TensorCores, 2 devices", 2, 2),
    Peak(("TPU v4",), False, 275e12, "Cloud TPU v4: 275 TFLOP/s bf16 per chip, one megacore device", 2, 1),
    Peak(("TPU v5 lite", "TPU v5e"), False, 197e12, "Cloud TPU v5e: 197 TFLOP/s bf16 per chip"),
    Peak(("TPU v5", "TPU v5p"), False, 459e12, "Cloud TPU v5p: 459 TFLOP/s bf16 per chip, one megacore device", 2, 1),
    Peak(("TPU v6 lite", "TPU v6e"), False, 918e12, "Cloud TPU v6e (Trillium): 918 TFLOP/s bf16 per chip"),
    Peak(("TPU7x",), False, 2307e12, "Cloud TPU7x (Ironwood): 2307 TFLOP/s bf16 per chip, 2 devices", 2, 2),
)


def lookup(device_kind: str) -> Peak | None:
    """The row for `device_kind`: an exact name first, then the longest matching prefix."""
    for row in TABLE:
        if not row.prefix and device_kind in row.kinds:
            return row
    prefixed = [(len(k), row) for row in TABLE if row.prefix for k in row.kinds if device_kind.startswith(k)]
    return max(prefixed, key=lambda item: item[0])[1] if prefixed else None


def device_peak(device_kind: str, num_cores: int | None) -> float | None:
    """Dense bf16 FLOP/s of one JAX device of this kind (None: not in the table)."""
    row = lookup(device_kind)
    if row is None:
        return None
    if num_cores is not None and num_cores > 0:  # a TPU device says how many of its chip's TensorCores it is
        return row.chip_flops * min(num_cores, row.cores_per_chip) / row.cores_per_chip
    return row.chip_flops / row.devices_per_chip


def peak_table(
    devices: Iterable[DeviceInfo], setting: float | None
) -> tuple[dict[tuple[str, int], tuple[float, str]], dict[tuple[str, int], str]]:
    """Each device's peak and where it comes from ("setting": `setting`, which overrides the table, or "table");
    and the devices with none, with their kind (the tracker says so once a step wants their MFU)."""
    peaks: dict[tuple[str, int], tuple[float, str]] = {}
    unknown: dict[tuple[str, int], str] = {}
    for d in devices:
        if setting is not None:
            peaks[d.key] = (setting, "setting")
        elif (peak := device_peak(d.device_kind, d.num_cores)) is not None:
            peaks[d.key] = (peak, "table")
        else:
            unknown[d.key] = d.device_kind
    return peaks, unknown
