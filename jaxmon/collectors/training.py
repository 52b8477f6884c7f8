"""The training collector: step time, throughput, FLOPs, MFU and goodput of the workload process itself.

Only inside a workload (embedded `jaxmon.start()`), where `jaxmon.step()` feeds the tracker (jaxmon/training);
spooled workloads' training series come with the spool collector. Its options are the tracker's: they apply in
the workload process (`jaxmon.start(training={...})`, `jaxmon.publish(..., training={...})`, `JAXMON_*`, YAML).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

from prometheus_client.core import Metric
from pydantic import Field, model_validator

from jaxmon.births import for_process, with_zeros
from jaxmon.catalog import metrics
from jaxmon.catalog.hardware import LINKS
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.families.training import training_families, training_labels
from jaxmon.identity import host_name
from jaxmon.sampled_traces import LEAD  # a sampled trace starts this many steps before its block
from jaxmon.settings import CollectorOptions, Enabled
from jaxmon.settings.schema import SettingsSection
from jaxmon.snapshot import Snapshot
from jaxmon.training_readings import TrainingReading

if TYPE_CHECKING:
    from jaxmon.training.tracker import TrackerConfig


# Sampled traces' default interval, sized so that their cost stays under 0.5 % of a job's throughput
# (bench/profile_sampling.py, BENCHMARKS.md "Sampled traces").
PROFILE_EVERY = 1000
# ... and at most one per this many seconds: a trace costs jaxmon's thread tens of milliseconds (the profiler's stop
# and the parse), which at 1000 steps of a millisecond would be tens of microseconds a step (issue 38's budget: 5).
PROFILE_MIN_SECONDS = 60.0
# What each sampled-trace option's help begins with: they act in a training workload (jaxmon.step()'s process), not
# on the daemon's own devices: `jaxmon serve` accepts them and they change nothing there.
_WORKLOAD_ONLY = (
    "Training workloads only (the process that embeds jaxmon: jaxmon.start(), jaxmon.publish()), never the daemon's "
    "own devices"
)
# A link of the device catalog, as collector.training.link_bandwidth names one.
_LINK = "(" + "|".join(LINKS) + ")"
# Declared badput kinds, at most: the tracker's own limit of user kinds (jaxmon.training.handed.MAX_USER_KINDS).
MAX_DECLARED_KINDS = 10


class TrainingProfileOptions(SettingsSection):
    """`--collector.training.profile.*`: sampled traces of whole steps (docs/training-traces.md)."""

    every: int = Field(
        default=PROFILE_EVERY,
        ge=0,
        le=100_000_000,
        description=f"{_WORKLOAD_ONLY}: trace `steps` whole steps every this many steps (blocks start at step "
        "numbers that are multiples of it, the same in every process of a job); 0 turns sampled traces off.",
    )
    steps: int = Field(default=2, ge=1, le=100, description=f"{_WORKLOAD_ONLY}: the steps each sampled trace holds.")
    min_seconds: float = Field(
        default=PROFILE_MIN_SECONDS,
        ge=0,
        le=86_400,
        description=f"{_WORKLOAD_ONLY}: at most one sampled trace per this many seconds (a block is traced when a "
        "period of this length began since the last block start, on the Unix clock: the same blocks in every process "
        "of a job); 0 traces every block.",
    )

    @model_validator(mode="after")
    def _room(self) -> TrainingProfileOptions:
        if self.every and self.every < self.steps + LEAD:
            raise ValueError(
                f"profile.every ({self.every}) must be 0 (off) or at least profile.steps + {LEAD} "
                f"({self.steps + LEAD}): a trace starts {LEAD} steps before its block"
            )
        return self


class TrainingOptions(CollectorOptions):
    """`--collector.training.*` (also `training:` / `start(training=...)`)."""

    enabled: Enabled = Field(
        default="auto", description="true, false, or auto (on inside a workload process that calls jaxmon.step())."
    )
    peak_flops: float | None = Field(
        default=None,
        gt=0,
        description="Dense bf16 peak FLOP/s of one device, overriding the table (needed for MFU on a device kind "
        "the table does not know, such as CPU).",
    )
    link_bandwidth: str = Field(
        default="",
        pattern=rf"^$|^{_LINK}=[0-9.eE+]+(,{_LINK}=[0-9.eE+]+)*$",
        description="Nominal bandwidth per direction of links, bytes/s, overriding the table for every device "
        "(`local=1e10,network=1.25e9`): for a device kind the table does not know (docs/placement.md).",
    )
    window: int = Field(default=100, ge=2, le=100_000, description="Steps MFU, HFU and the stall median cover.")
    stall_factor: float = Field(
        default=3.0, gt=1, le=1000, description="A step longer than this x the window's median is a stall."
    )
    max_pending: int = Field(
        default=8192, ge=1, le=1_000_000, description="Steps waiting to complete, at most; more are not tracked."
    )
    profile: TrainingProfileOptions = Field(default_factory=TrainingProfileOptions)
    badput_kinds: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=MAX_DECLARED_KINDS,
        description="Your badput() kinds, declared up front so that their series exist at 0 from start() or "
        f"publish() ({metrics.TRAINING_BADPUT_SECONDS.exposed}{{kind}}); one not declared is born at 0 at its first "
        "open, and counts its seconds from its close (after a scrape served the 0).",
    )

    def tracker_config(self) -> TrackerConfig:
        """What the tracker takes of these options (the tracker itself is loaded only in a training process)."""
        from jaxmon.training.handed import SamplerConfig, TrackerConfig

        return TrackerConfig(
            self.peak_flops,
            self.window,
            self.stall_factor,
            self.max_pending,
            profile=SamplerConfig(self.profile.every, self.profile.steps, self.profile.min_seconds),
            link_bandwidth=tuple(
                (link, float(value))
                for link, value in (item.split("=", 1) for item in self.link_bandwidth.split(",") if item)
            ),
        )


@register
class TrainingCollector(Collector[TrainingOptions, TrainingReading | None]):
    """The tracker's reading, every poll."""

    name = "training"
    description = "Training steps, step time, throughput, FLOPs, MFU/HFU and goodput of the workload (jaxmon.step)."
    options = TrainingOptions
    order = 35

    @classmethod
    def unavailable(cls, opts: TrainingOptions, ctx: Context) -> str | None:
        """Only a workload process has steps of its own."""
        return ctx.not_in_workload()

    def __init__(self, opts: TrainingOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        # The process's: a tracker that runs on through a stop() and a start() (a publisher holds it) counts on.
        self._births = for_process(self.name)
        self._unheld: tuple[TrainingReading | None, TrainingReading | None] = (None, None)  # the last state, unheld

    def update(self) -> Update[TrainingReading | None]:
        """The tracker's numbers now (from start(), every counter at 0 before it happens), each new series held at
        0 until a scrape has served it (jaxmon.births)."""
        assert self.ctx.in_process is not None  # unavailable() otherwise
        reading = self.ctx.in_process.training()
        if reading is None:
            return Update(None)
        self._births.begin()
        try:
            # A new tracker's counters start again at 0: new series to Prometheus, held (a reset it sees).
            key = (self.ctx.workload or "", self.ctx.in_process.process_index, round(reading.start_time_seconds, 3))
            values = with_zeros(reading)
            held = self._births.training(key, values)
        finally:
            self._births.end()
        self._unheld = (held, values)
        return Update(held)

    def unheld(self, state: TrainingReading | None) -> TrainingReading | None:
        """The counters at their values (what readers other than Prometheus are served)."""
        held, values = self._unheld
        return values if state is held and state is not None else state

    def families(self, snap: Snapshot, state: TrainingReading | None) -> Iterator[Metric]:
        """One set of series for this workload process, once it steps."""
        assert self.ctx.in_process is not None
        me = self.ctx.in_process
        labels = training_labels(self.ctx.workload or "", me.process_index, me.process_count, host_name())
        return training_families([(labels, state)] if state is not None else [])
