"""Each tracked device's peak FLOP/s, the denominator of MFU and HFU: the device catalog's dense bf16 figure for its
kind (jaxmon.catalog.hardware), or the setting (collector.training.peak_flops), which overrides it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from jaxmon.catalog.hardware import device_peak

if TYPE_CHECKING:
    from jaxmon.device_readings import DeviceInfo


def peak_table(
    devices: Iterable[DeviceInfo], setting: float | None
) -> tuple[dict[tuple[str, int], tuple[float, str]], dict[tuple[str, int], str]]:
    """Each device's peak and where it comes from ("setting": `setting`, which overrides the catalog, or "table");
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
