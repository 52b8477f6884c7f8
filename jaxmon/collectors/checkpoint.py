"""The checkpoint collector: the workload process's last checkpoint and the interval its job declared
(jaxmon.checkpoints), so that a panel says what a crash now would lose and an alert (JaxmonTrainingCheckpointOverdue)
when the job has not checkpointed for longer than it said it would.

Only inside a workload (embedded `jaxmon.start()`); a publisher writes the same into its spool document (the spool
collector renders it). Its options apply in the workload process (`jaxmon.start(collector={"checkpoint":
{"interval": "30m"}})`, `JAXMON_COLLECTOR__CHECKPOINT__INTERVAL`, YAML).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from pydantic import Field

from jaxmon.checkpoints import CheckpointReading
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.families.checkpoint import checkpoint_families
from jaxmon.families.training import training_labels
from jaxmon.identity import host_name
from jaxmon.settings import CollectorOptions, Duration, Enabled
from jaxmon.snapshot import Snapshot


class CheckpointOptions(CollectorOptions):
    """`--collector.checkpoint.*`: on inside a workload process (embedded), off in a daemon."""

    enabled: Enabled = Field(
        default="auto", description="true, false, or auto (on inside a workload process: jaxmon.start())."
    )
    interval: Duration | None = Field(
        default=None,
        description="How often the job checkpoints (e.g. 30m): exported, and JaxmonTrainingCheckpointOverdue fires "
        "when its last checkpoint is 1.5 times this old while it steps.",
    )
    interval_steps: int | None = Field(
        default=None,
        ge=1,
        description="Every how many steps the job checkpoints (Orbax's save_interval_steps): as `interval`, in steps.",
    )

    def declared(self, reading: CheckpointReading) -> CheckpointReading:
        """`reading` with the interval these options declare."""
        return CheckpointReading(reading.step, reading.time, self.interval, self.interval_steps)


@register
class CheckpointCollector(Collector[CheckpointOptions, CheckpointReading]):
    """The workload process's checkpoints (Orbax's saves, jaxmon.checkpointed())."""

    name = "checkpoint"
    description = "The workload process's last checkpoint (Orbax's saves, jaxmon.checkpointed()) and its interval."
    options = CheckpointOptions
    order = 36

    @classmethod
    def unavailable(cls, opts: CheckpointOptions, ctx: Context) -> str | None:
        """Only a workload process has checkpoints of its own."""
        return ctx.not_in_workload()

    def update(self) -> Update[CheckpointReading]:
        """The last checkpoint now."""
        assert self.ctx.in_process is not None  # unavailable() otherwise
        return Update(self.opts.declared(self.ctx.in_process.checkpoints()))

    def families(self, snap: Snapshot, state: CheckpointReading) -> Iterator[Metric]:
        """One series of each family this process has a number for, with its training series' labels."""
        me = self.ctx.in_process
        assert me is not None
        labels = training_labels(self.ctx.workload or "", me.process_index, me.process_count, host_name())
        return checkpoint_families([(labels, state)])
