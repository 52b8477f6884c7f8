"""What the tpu collector makes of libtpu's monitoring SDK (read by sdk.py; rendered by jaxmon.families.libtpu):
TensorCore utilization per core, the rung between the duty cycle and MFU that libtpu's gRPC service does not
serve, and a status that says why there is none.

Only `tensorcore_util` becomes a series. The SDK's other metrics either repeat what the gRPC service already gives
(duty_cycle_pct, hbm_capacity_*, hlo_queue_size, hlo_execution_timing, the megascale and TCP distributions) or have
a format no one has seen with data (tpu_throttle_score, runtime_hbm_utilization: on a real v5e every SDK metric
returned []), and a series read from a guessed format is a wrong number. `duty_cycle_pct` and
`hbm_capacity_total` are asked for too, for their count alone: one entry per chip, so `tensorcore_util`'s entries
(one per TensorCore) map onto chips.

The SDK is read by a child process of the daemon only: never inside a training process (the embedded exporter does
not start it), since importing libtpu there has crashed jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jaxmon.sources.libtpu import sdk


@dataclass(frozen=True)
class CoreUtilization:
    """One TensorCore's utilization: its chip's label (`device`) and its index in the SDK's list."""

    device: str
    core: int
    ratio: float


@dataclass(frozen=True)
class SdkState:
    """The SDK's status this poll, why, the child's starts (and the starts that failed) so far, and each TensorCore's
    utilization."""

    status: str
    detail: str = ""
    starts: int = 0
    cores: tuple[CoreUtilization, ...] = ()
    unreadable: int = 0
    spawn_failures: int = 0


def cores(reading: sdk.SdkReading, libtpu_ids: Sequence[int]) -> tuple[tuple[CoreUtilization, ...], int]:
    """Each TensorCore's utilization, labelled by its chip; and how many entries were no percentage.

    The SDK lists cores in order, chip after chip. A chip's `device` is libtpu's device-id of the same position where
    the gRPC service answered as many device-ids as the SDK has chips (both are the same libtpu's), else the chip's
    position: the two numberings cannot be joined in any other way.
    """
    values = sdk.percents(reading.data.get(sdk.TENSORCORE_UTIL, ()))
    if not values:
        return (), 0
    chips = next((len(reading.data[n]) for n in sdk.PER_CHIP if reading.data.get(n)), len(values))
    per_chip = len(values) // chips if chips and len(values) % chips == 0 else 1
    n_chips = len(values) // per_chip
    ids = sorted(libtpu_ids)
    names = [str(i) for i in ids] if len(ids) == n_chips else [str(i) for i in range(n_chips)]
    out = tuple(CoreUtilization(names[i // per_chip], i, value) for i, value in enumerate(values) if value is not None)
    return out, sum(v is None for v in values)


def state(reading: sdk.SdkReading, starts: int, libtpu_ids: Sequence[int], spawn_failures: int = 0) -> SdkState:
    """The state of one poll of the SDK."""
    found, unreadable = cores(reading, libtpu_ids)
    status, detail = reading.status, reading.detail
    if status == "ok" and not found:
        status, detail = (
            "failed",
            "tensorcore_util answered no percentage: " + ", ".join(reading.data.get(sdk.TENSORCORE_UTIL, ()))[:300],
        )
    return SdkState(status, detail, starts, found, unreadable, spawn_failures)
