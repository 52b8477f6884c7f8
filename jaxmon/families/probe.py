"""The probe's families: each exported probe series and how to read it from a device's ProbeStatus (the probe
collector renders them; docs/probe.md says what each means, and what a run deferred for the job leaves in it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jaxmon.catalog import metrics
from jaxmon.catalog.metrics import Family
from jaxmon.device_readings import ProbeStatus


@dataclass(frozen=True)
class ProbeMetric:
    """One exported probe series and how to read it from a ProbeStatus."""

    family: Family
    value: Callable[[ProbeStatus], float | None]
    # Rendered on every CPU device from the one probed CPU device (they share the host's cores).
    shared: bool = False


def _opt(v: float | int | bool | None) -> float | None:
    return None if v is None else float(v)


PROBE_METRICS = (
    ProbeMetric(metrics.DEVICE_UP, lambda p: _opt(p.up), shared=True),
    ProbeMetric(metrics.DEVICE_UTILIZATION_RATIO, lambda p: _opt(p.utilization_ratio) if p.up else None, shared=True),
    ProbeMetric(metrics.PROBE_DURATION_SECONDS, lambda p: _opt(p.last_duration_seconds)),
    ProbeMetric(metrics.PROBE_BASELINE_SECONDS, lambda p: _opt(p.baseline_seconds)),
    ProbeMetric(metrics.PROBE_FLOPS_PER_SECOND, lambda p: _opt(p.flops_per_second)),
    ProbeMetric(metrics.PROBE_MEMORY_BYTES, lambda p: _opt(p.footprint_bytes)),
    ProbeMetric(metrics.PROBE_STEPS, lambda p: float(p.steps) if p.calibrated else None),
    ProbeMetric(metrics.PROBE_RUNS, lambda p: float(p.runs_total)),
    ProbeMetric(metrics.PROBE_FAILURES, lambda p: float(p.failures_total)),
    ProbeMetric(metrics.PROBE_TIMEOUTS, lambda p: float(p.timeouts_total)),
    ProbeMetric(metrics.PROBE_SKIPPED, lambda p: float(p.skipped_total)),
    ProbeMetric(metrics.PROBE_DEFERRED, lambda p: float(p.deferred_total)),
    ProbeMetric(metrics.PROBE_BUSY_SECONDS, lambda p: float(p.busy_seconds_total)),
)
