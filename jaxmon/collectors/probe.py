"""The probe collector: a jit-compiled kernel timed on every device, for health and a utilization estimate.

The timing engine (one worker thread per device, calibration, timeouts) is `jaxmon.probe`; this module schedules
it, staggered across the interval so devices that share hardware do not time each other, and renders its status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import structlog
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.collectors import register
from jaxmon.collectors.base import (
    Collector,
    CollectorOptions,
    Context,
    Enabled,
    Job,
    Update,
    add,
    family,
    sample_name,
)
from jaxmon.collectors.devicewide import BUSY_DUTY_CYCLE, DutyCycles, HostCpuMeter
from jaxmon.logsetup import ErrorLog
from jaxmon.model import DeviceInfo, ProbeKernel, ProbeStatus
from jaxmon.probe import WARMUP_STEPS, DeviceProbe, ProbeConfig
from jaxmon.probe_baseline import BaselineStore
from jaxmon.snapshot import Snapshot

log = structlog.get_logger("jaxmon.collectors.probe")


@dataclass(frozen=True)
class ProbeMetric:
    """One exported probe series and how to read it from a ProbeStatus."""

    name: str
    help: str
    value: Callable[[ProbeStatus], float | None]
    counter: bool = False


def _opt(v: float | int | bool | None) -> float | None:
    return None if v is None else float(v)


PROBE_METRICS = (
    ProbeMetric(
        "jaxmon_device_up",
        "1 when the device answered its last probe within the timeout, 0 when it failed or timed out.",
        lambda p: _opt(p.up),
    ),
    ProbeMetric(
        "jaxmon_device_utilization_ratio",
        "ESTIMATED share of the device busy with other work, from probe slowdown: "
        "1 - probe_baseline_seconds / probe_duration_seconds, clamped to [0, 1].",
        lambda p: _opt(p.utilization_ratio) if p.up else None,
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
        "jaxmon_probe_busy_seconds",
        "Seconds of probe runs on the device; its rate() is the probe's duty cycle.",
        lambda p: float(p.busy_seconds_total),
        counter=True,
    ),
)


@dataclass(frozen=True)
class ProbeState:
    """The status of every probed device, copied at one instant."""

    statuses: Mapping[tuple[str, int], ProbeStatus] = field(default_factory=dict)


class ProbeOptions(CollectorOptions):
    """`--collector.probe`: on by default wherever the source can run probes (not on replayed devices)."""

    enabled: Enabled = "auto"


@register
class ProbeCollector(Collector[ProbeState]):
    """Per-device probe runs on the scheduler; the state is every device's latest ProbeStatus."""

    name = "probe"
    description = "A jit-compiled probe per device: device_up, latency, baseline and a utilization estimate."
    options = ProbeOptions
    order = 20
    heartbeat = False  # each device's health is jaxmon_device_up; /healthz is about fresh polls

    @classmethod
    def unavailable(cls, ctx: Context) -> str | None:
        """Replayed devices cannot be probed."""
        return None if ctx.source.runs_probes else f"source {ctx.source.name} runs no probes"

    def __init__(self, ctx: Context, options: CollectorOptions) -> None:
        super().__init__(ctx, options)
        s = ctx.settings.probe
        self.config = ProbeConfig(
            size=s.size,
            timeout_seconds=s.timeout,
            target_seconds=s.target,
            repeats=s.repeats,
            spacing_seconds=s.spacing,
        )
        errors = ErrorLog(log)
        calibration_lock = threading.Lock()
        store = BaselineStore(s.baseline_file) if s.baseline_file is not None else None
        self.probes: dict[tuple[str, int], DeviceProbe] = {
            dev.key: DeviceProbe(
                dev,
                self._kernel_factory(dev),
                self.config,
                errors,
                calibration_lock,
                on_late_result=self._changed_outside_a_run,
                store=store,
                store_key=self._store_key(dev),
                busy=self._busy_check(dev),
                idle=self._idle_check(dev),
            )
            for dev in ctx.devices
        }

    def _store_key(self, dev: DeviceInfo) -> str:
        from jaxmon.app import package_version

        return (
            f"{dev.platform}:{dev.id}:{dev.device_kind}|jax={package_version('jax')}"
            f"|jaxlib={package_version('jaxlib')}|size={self.config.size}|target={self.config.target_seconds:g}"
            f"|seed=warmup{WARMUP_STEPS}|spacing={self.config.spacing_seconds:g}"
        )

    def _duty_cycle(self, dev: DeviceInfo) -> float | None:
        """The device's last duty cycle from a device-wide collector (NVML, libtpu); None when none knows it."""
        snapshot = self.ctx.snapshot
        if snapshot is None:
            return None
        for state in snapshot().states.values():
            if isinstance(state, DutyCycles):
                duty = state.duty_cycle(dev.platform, dev.id)
                if duty is not None:
                    return duty
        return None

    def _busy_check(self, dev: DeviceInfo) -> Callable[[], bool]:
        def busy() -> bool:
            """True when a device-wide source reports the device busy with other work (no calibration now)."""
            duty = self._duty_cycle(dev)
            return duty is not None and duty >= BUSY_DUTY_CYCLE

        return busy

    def _idle_check(self, dev: DeviceInfo) -> Callable[[], bool | None]:
        # CPU devices are the host's cores: the host's CPU time outside jaxmon is their device-wide reading (one
        # meter per device, since a reading covers the time since that device's previous one). It only picks the
        # timings the baseline follows, never defers a calibration: on a shared host it is rarely quiet enough.
        meter = HostCpuMeter(exclude_own=self.ctx.in_process is None) if dev.platform == "cpu" else None

        def idle() -> bool | None:
            """Whether the device was idle apart from the probe since the previous call; None: nothing knows."""
            duty = self._duty_cycle(dev)
            if duty is not None:
                return duty < BUSY_DUTY_CYCLE
            share = meter.others_share() if meter is not None else None
            return None if share is None else share < BUSY_DUTY_CYCLE

        return idle

    def _kernel_factory(self, dev: DeviceInfo) -> Callable[[], ProbeKernel]:
        def make() -> ProbeKernel:
            kernel = self.ctx.source.make_probe(dev, self.config.size)
            if kernel is None:
                raise RuntimeError(f"source {self.ctx.source.name} cannot probe {dev.name}")
            return kernel

        return make

    @property
    def interval(self) -> float:
        """Seconds between runs on each device."""
        return self.ctx.settings.probe.interval

    def jobs(self) -> list[Job]:
        """One job per device, each first run at once. Devices that do not share hardware (GPU, TPU) run
        together; CPU devices share the host's cores, so their runs are a quarter second apart (a run takes
        milliseconds): none times another's load, and none waits long for its first probe."""
        shared = any(dev.platform == "cpu" for dev in self.ctx.devices)
        gap = min(self.interval / max(len(self.probes), 1), 0.25) if shared else 0.0
        return [
            Job(f"probe-{probe.device.name}", self.interval, self._runner(probe), first_delay=0.2 + i * gap)
            for i, probe in enumerate(self.probes.values())
        ]

    def _runner(self, probe: DeviceProbe) -> Callable[[], Update[ProbeState] | None]:
        def run() -> Update[ProbeState] | None:
            probe.run_once()
            return self.current()

        return run

    def update(self) -> Update[ProbeState]:
        """One run on every device, one after the other (`jaxmon snapshot`)."""
        for probe in self.probes.values():
            probe.run_once()
        result = self.current()
        return result if result is not None else Update(ProbeState(), success=False)

    def current(self) -> Update[ProbeState] | None:
        """The statuses now; success when every device that ran answered; duration is one round's device time.
        None before any probe ran."""
        statuses = {key: probe.status() for key, probe in self.probes.items()}
        ran = [st for st in statuses.values() if st.up is not None]
        if not ran:
            return None
        return Update(
            ProbeState(statuses),
            success=all(st.up for st in ran),
            duration_seconds=sum(st.last_duration_seconds or 0.0 for st in ran),
        )

    def _changed_outside_a_run(self) -> None:
        # A run that outlived its timeout finished on the worker thread: record what it changed.
        result = self.current()
        if result is not None:
            self.publish(result)

    def families(self, snap: Snapshot, state: ProbeState) -> Iterator[Metric]:
        """The probe families of every probed device."""
        families = {m.name: family(m.name, m.help, m.counter) for m in PROBE_METRICS}
        targets = [(m.value, families[m.name].samples.append, sample_name(families[m.name])) for m in PROBE_METRICS]
        origin = family(
            "jaxmon_probe_baseline_info",
            "Where the probe's baseline comes from, always 1: calibrated (now, device idle), restored "
            "(--probe.baseline-file), provisional (taken while a device-wide source said the device was busy; "
            "no utilization estimate until an idle recalibration).",
        )
        for dev in snap.devices:
            status = state.statuses.get(dev.key)
            if status is None:
                continue
            labels = snap.device_labels(dev)
            for read, append, sname in targets:
                value = read(status)
                if value is not None:
                    append(Sample(sname, labels, value))
            if status.baseline_origin is not None:
                add(origin, {**labels, "origin": status.baseline_origin}, 1)
        yield from families.values()
        yield origin

    def stop(self) -> None:
        """End every probe's worker thread."""
        for probe in self.probes.values():
            probe.stop()
        deadline = time.monotonic() + 0.5
        for probe in self.probes.values():
            probe.join(max(deadline - time.monotonic(), 0.0))
