"""The checkpoint families: the last checkpoint of a workload process and the interval its job declared (embedded:
the checkpoint collector; the spool's workloads: the spool collector)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric

from jaxmon.catalog import metrics
from jaxmon.checkpoints import CheckpointReading
from jaxmon.families import add


def checkpoint_families(rows: Iterable[tuple[dict[str, str], CheckpointReading]]) -> Iterator[Metric]:
    """The four families, one series each per process that has the number (a training process's labels)."""
    step = metrics.TRAINING_LAST_CHECKPOINT_STEP.new()
    when = metrics.TRAINING_LAST_CHECKPOINT_TIMESTAMP_SECONDS.new()
    interval = metrics.TRAINING_CHECKPOINT_INTERVAL_SECONDS.new()
    steps = metrics.TRAINING_CHECKPOINT_INTERVAL_STEPS.new()
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
