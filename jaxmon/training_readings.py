"""What a training process reports: plain numbers, the same whether rendered in-process or published to a spool.

The training tracker (jaxmon.training) makes them; the collectors, the spool's codec and the births render, carry
and hold them, so they live outside the training wing: a daemon reading spooled workloads loads none of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# The loss gauge's bounds: names (label values) kept, the first in sorted order, and each name's length.
MAX_LOSS_NAMES = 16
MAX_LOSS_NAME = 64


def bounded_loss(loss: Mapping[str, float]) -> tuple[dict[str, float], int]:
    """The loss gauge's values as exported, and how many names were left out: the first MAX_LOSS_NAMES names in
    sorted order, each cut to MAX_LOSS_NAME characters and made valid UTF-8; an empty name, or one that is the same
    as a name before it once cut, is left out."""
    out: dict[str, float] = {}
    names = sorted(loss)
    for name in names:
        label = name[:MAX_LOSS_NAME].encode("utf-8", "replace").decode("utf-8")
        if len(out) < MAX_LOSS_NAMES and label and label not in out:
            out[label] = float(loss[name])
    return out, len(names) - len(out)


@dataclass(frozen=True)
class DeviceTraining:
    """One local device's FLOPs, utilization and communication; None where it is not known.

    `collective_bytes_total`: bytes of the tracked programs' collectives by (op, axes, link), axes the user's mesh
    axes comma-joined ("" without a mesh), link the slowest their groups cross (jaxmon.training.links);
    `program_peak_memory_bytes`: the largest predicted peak memory of the programs the last window's steps called."""

    platform: str
    id: int
    model_flops_total: float | None = None
    hardware_flops_total: float | None = None
    hardware_bytes_total: float | None = None
    peak_flops: float | None = None
    peak_source: str | None = None  # "table" or "setting"
    mfu: float | None = None
    hfu: float | None = None
    collective_bytes_total: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    program_peak_memory_bytes: float | None = None
    # Each link's nominal bandwidth per direction for the device's kind (jaxmon.catalog.hardware; {}: not known).
    link_bandwidth: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceProfile:
    """One local device's time in the sampled traces (jaxmon.training.sampler), in seconds since the tracker
    started: `parts` (compute, collective, copy, idle) sum to `profiled_seconds_total`; `collectives` is the union
    time of each collective kind, overlapped with compute or not."""

    platform: str
    id: int
    profiled_seconds_total: float = 0.0
    parts: Mapping[str, float] = field(default_factory=dict)
    collectives: Mapping[str, float] = field(default_factory=dict)
    # (op, axes, link) -> (seconds run, exposed seconds, bytes of its events in the windows): trace_links
    placed: Mapping[tuple[str, str, str], tuple[float, float, float]] = field(default_factory=dict)
    # copy direction (host_to_device, device_to_host, device_to_device, other) -> (seconds of the `copy` part,
    # bytes where the trace says them): trace_links
    copies: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # The last sample's collective wait on this device: its collective part (exposed collectives) over the sampled
    # steps' time, 0..1; None before the device's first sample, or when the last sample did not hold it.
    sample_wait_ratio: float | None = None


@dataclass(frozen=True)
class ProfileReading:
    """The sampled traces of a training process: samples by result (taken, busy, failed) and each device's split;
    `sample_step` the first step number of the last sample taken (the steps each device's `sample_wait_ratio` is
    of; every process of a job traces the same step numbers), None before the first."""

    results: Mapping[str, int] = field(default_factory=dict)
    devices: tuple[DeviceProfile, ...] = ()
    sample_step: int | None = None


@dataclass(frozen=True)
class TrainingReading:
    """A training process's telemetry at one instant (counters since its tracker started)."""

    steps_total: int = 0
    step: int | None = None
    # The last step number handed to jaxmon.step(), complete or not: in a synchronous job the others wait for the
    # process that is behind.
    dispatched_step: int | None = None
    last_step_timestamp: float | None = None
    # (upper bound, cumulative count), +Inf last; the step durations' sum.
    duration_buckets: tuple[tuple[float, int], ...] = ()
    duration_sum: float = 0.0
    examples_total: float = 0.0
    tokens_total: float = 0.0
    host_wait_seconds_total: float = 0.0
    # Unix time the tracker started (jaxmon.start() or publish()), like last_step_timestamp read from the wall clock
    # at the event: productive + badput (counted on the monotonic clock) = last_step_timestamp - it, but for the
    # wall clock's corrections in between (NTP's slew, parts per million; a step, all of it).
    start_time_seconds: float = 0.0
    productive_seconds_total: float = 0.0
    badput_seconds_total: Mapping[str, float] = field(default_factory=dict)
    devices: tuple[DeviceTraining, ...] = ()
    # What the tracker could not use, by reason: back, jump (step numbers), unready (a deleted buffer), invalid (a
    # figure or step number that is not one), unread (a figure or step number array deleted before it was read),
    # dropped (the waiter fell too far behind), cost (no cost analysis), badput_kinds (a badput() kind past the
    # 10th), intervals (closed badput intervals dropped past MAX_INTERVALS), programs (a tracked function's program
    # forgotten past MAX_PROGRAMS), communication (a program's HLO or memory analysis failed), error.
    problems: Mapping[str, int] = field(default_factory=dict)
    # The sampled traces; None when sampling is off (collector.training.profile.every = 0).
    profile: ProfileReading | None = None
    # The loss gauge: the last looked-at step's scalars as read (NaN and inf as they are), by name (at most
    # MAX_LOSS_NAMES, each at most MAX_LOSS_NAME characters: bounded_loss); `loss_step` the step they are of.
    loss: Mapping[str, float] = field(default_factory=dict)
    loss_step: int | None = None

    @property
    def duration_count(self) -> int:
        """Step durations observed."""
        return self.duration_buckets[-1][1] if self.duration_buckets else 0
