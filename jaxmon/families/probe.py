"""The probe's families: each exported probe series and how to read it from a device's ProbeStatus (the probe
collector renders them; docs/probe.md says what each means, and what a run deferred for the job leaves in it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jaxmon.device_readings import ProbeStatus


@dataclass(frozen=True)
class ProbeMetric:
    """One exported probe series and how to read it from a ProbeStatus."""

    name: str
    help: str
    value: Callable[[ProbeStatus], float | None]
    counter: bool = False
    # Rendered on every CPU device from the one probed CPU device (they share the host's cores).
    shared: bool = False


def _opt(v: float | int | bool | None) -> float | None:
    return None if v is None else float(v)


PROBE_METRICS = (
    ProbeMetric(
        "jaxmon_device_up",
        "1 when the device answered its last probe within the timeout, 0 when it failed or timed out; 1 while "
        "the job in this process trains on it (its steps complete; no probe runs then). CPU devices share the "
        "host's cores and one probe: each carries the probed CPU device's answer.",
        lambda p: _opt(p.up),
        shared=True,
    ),
    ProbeMetric(
        "jaxmon_device_utilization_ratio",
        "ESTIMATED share of the device busy with other work, from probe slowdown: "
        "1 - probe_baseline_seconds / probe_duration_seconds, clamped to [0, 1] (CPU devices: the probed CPU "
        "device's estimate of the host's cores). Absent while the device is down, and while the job in this "
        "process trains on it (no probe runs then).",
        lambda p: _opt(p.utilization_ratio) if p.up else None,
        shared=True,
    ),
    ProbeMetric(
        "jaxmon_probe_duration_seconds",
        "Latency of the last completed probe timing (the median of its shots).",
        lambda p: _opt(p.last_duration_seconds),
    ),
    ProbeMetric(
        "jaxmon_probe_baseline_seconds",
        "Idle probe latency: the median of recent timings a device-wide source saw idle (CPU devices: the host's "
        "CPU time), or without one the lower of the start-up calibration and the median of recent timings.",
        lambda p: _opt(p.baseline_seconds),
    ),
    ProbeMetric(
        "jaxmon_probe_flops_per_second",
        "FLOP/s the last probe run achieved (compiled cost analysis x steps / latency).",
        lambda p: _opt(p.flops_per_second),
    ),
    ProbeMetric(
        "jaxmon_probe_memory_bytes",
        "Device memory the compiled probe uses (arguments + output + temporaries), allocated once.",
        lambda p: _opt(p.footprint_bytes),
    ),
    ProbeMetric(
        "jaxmon_probe_steps",
        "Matmul steps per probe run, chosen by calibration.",
        lambda p: float(p.steps) if p.calibrated else None,
    ),
    ProbeMetric("jaxmon_probe_runs", "Probe runs started.", lambda p: float(p.runs_total), counter=True),
    ProbeMetric(
        "jaxmon_probe_failures",
        "Probe runs that raised an error.",
        lambda p: float(p.failures_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_timeouts",
        "Probe runs that did not finish within the timeout.",
        lambda p: float(p.timeouts_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_skipped",
        "Scheduled probe runs skipped because the previous run was still in flight (a hung device).",
        lambda p: float(p.skipped_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_deferred",
        "Scheduled probe runs not dispatched because the job in this process was training on the device (a step "
        "of it ended within the probe interval): jaxmon runs no program beside the job's. Meanwhile the device is "
        "up and has no utilization estimate.",
        lambda p: float(p.deferred_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_busy_seconds",
        "Seconds of probe runs on the device; its rate() is the probe's duty cycle.",
        lambda p: float(p.busy_seconds_total),
        counter=True,
    ),
)
