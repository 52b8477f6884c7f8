"""The checkpoint families: the last checkpoint of a workload process and the interval its job declared (embedded:
the checkpoint collector; the spool's workloads: the spool collector)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric

from jaxmon.checkpoints import CheckpointReading
from jaxmon.families import Spec, add

LAST_STEP = Spec(
    "jaxmon_training_last_checkpoint_step",
    "The step whose state the process's last checkpoint holds: the number last handed to jaxmon.step() when an "
    "Orbax save that completed started, or jaxmon.checkpointed(step). jaxmon_training_step minus it is the steps a "
    "crash now would compute again.",
)
LAST_TIME = Spec(
    "jaxmon_training_last_checkpoint_timestamp_seconds",
    "Unix time the state of the process's last checkpoint was taken (an Orbax save's start; jaxmon.checkpointed()'s "
    "time): what a restore brings back. time() minus it is what a crash now would lose.",
)
INTERVAL = Spec(
    "jaxmon_training_checkpoint_interval_seconds",
    "How often the job said it checkpoints (collector.checkpoint.interval); absent when it did not say.",
)
INTERVAL_STEPS = Spec(
    "jaxmon_training_checkpoint_interval_steps",
    "Every how many steps the job said it checkpoints (collector.checkpoint.interval_steps); absent when it did not "
    "say.",
)
SPECS = (LAST_STEP, LAST_TIME, INTERVAL, INTERVAL_STEPS)
# Their labels and where their numbers come from (jaxmon/families/labels.py), with the embedded exporter's word on
# how its process ended (jaxmon.lastword): what a crash lost, and that it was one.
_TRAINING = "workload, process_index, process_count, host"
LABELS_AND_SOURCE = {
    "jaxmon_exporter_exit_info": (
        "reason, signal",
        "the interpreter's exit, `sys.excepthook`, jaxmon's SIGTERM handler",
    ),
    LAST_STEP.name: (_TRAINING, "Orbax's save events (jax.monitoring), `jaxmon.checkpointed()`"),
    LAST_TIME.name: (_TRAINING, "Orbax's save events (jax.monitoring), `jaxmon.checkpointed()`"),
    INTERVAL.name: (_TRAINING, "`collector.checkpoint.interval`"),
    INTERVAL_STEPS.name: (_TRAINING, "`collector.checkpoint.interval_steps`"),
}


def checkpoint_families(rows: Iterable[tuple[dict[str, str], CheckpointReading]]) -> Iterator[Metric]:
    """The four families, one series each per process that has the number (a training process's labels)."""
    step, when, interval, steps = (spec.new() for spec in SPECS)
    for labels, r in rows:
        if r.step is not None:
            add(step, labels, r.step)
        if r.time is not None:
            add(when, labels, r.time)
        if r.interval_seconds is not None:
            add(interval, labels, r.interval_seconds)
        if r.interval_steps is not None:
            add(steps, labels, r.interval_steps)
    yield from (step, when, interval, steps)
