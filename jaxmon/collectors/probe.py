"""The probe collector: a jit-compiled kernel timed on every device, for health and a utilization estimate.

The timing engine (one worker thread per device, calibration, timeouts) is `jaxmon.probe`; this module owns the
probe's settings (`--collector.probe.*`), schedules the engine and renders its status. CPU devices are the host's
cores, shared by every CPU device of the process, so one CPU device is probed and its answer stands for all of
them: every CPU device carries its metrics.DEVICE_UP and utilization estimate, and the `jaxmon_probe_*` series
are on the probed device alone.

While the job in this process trains on a device (a step of it ended within the probe interval), the probe
dispatches nothing there: jaxmon runs no program of its own beside the job's (on XLA:CPU every device's programs
share one thread pool, and a probe there added to the contention that starves a collective). The run is counted as
deferred; the device is up (the job's steps complete on it) and has no utilization estimate (docs/probe.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import structlog
from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from pydantic import BeforeValidator, Field, model_validator

from jaxmon.catalog import metrics
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, PollJob, Update
from jaxmon.device_readings import DeviceInfo, ProbeKernel, ProbeStatus
from jaxmon.exchange import DUTY_CYCLES
from jaxmon.families import add, sample_name
from jaxmon.families.probe import PROBE_METRICS
from jaxmon.logsetup import ErrorLog
from jaxmon.probe import WARMUP_STEPS, DeviceProbe, ProbeConfig, longest_pauses
from jaxmon.probe.baseline import BaselineStore
from jaxmon.probe.idle import BUSY_DUTY_CYCLE, HostCpuMeter
from jaxmon.settings import CollectorOptions, Duration, Enabled, format_duration, parse_duration
from jaxmon.settings.durations import bounded
from jaxmon.snapshot import Snapshot
from jaxmon.versions import package_version

log = structlog.get_logger("jaxmon.collectors.probe")


Spacing = Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 1.0)]


@dataclass(frozen=True)
class ProbeState:
    """The status of every probed device, copied at one instant, and which probed device stands for the others."""

    statuses: Mapping[tuple[str, int], ProbeStatus] = field(default_factory=dict)
    # An unprobed CPU device -> the CPU device whose probe answers for it.
    shared: Mapping[tuple[str, int], tuple[str, int]] = field(default_factory=dict)


class ProbeOptions(CollectorOptions):
    """`--collector.probe.*` (formerly `--probe.*`)."""

    enabled: Enabled = Field(
        default="auto", description="true, false, or auto (on wherever the source can run probes: not on replays)."
    )
    interval: Duration = Field(default=15.0, description="Time between probe runs on each device.")
    timeout: Duration = Field(default=5.0, description="A probe run longer than this marks its device down.")
    size: int = Field(default=256, ge=8, le=2048, description="Probe matrix size n (three n x n float32).")
    target: Duration = Field(
        default=0.002, description="Calibrated length of one idle probe run (steps are chosen to reach it)."
    )
    repeats: int = Field(
        default=3,
        ge=1,
        le=10,
        description="Each probe timing is the median of this many shots (a shot: a one-step warm-up, then the "
        "timed run); robust to preemption and to the host's momentary speed.",
    )
    spacing: Spacing = Field(
        default=0.1, description="Pause between the shots of one timing (and between calibration seeds); up to 1s."
    )
    each_cpu_device: bool = Field(
        default=False,
        description="Probe every CPU device on its own (they share the host's cores, so by default one is probed "
        "for all; this costs one probe per CPU device).",
    )
    baseline_file: Path | None = Field(
        default=None,
        description="Keep each device's idle calibration here; a restart reuses a matching one instead of "
        "calibrating while training may already be running.",
    )

    @model_validator(mode="after")
    def _timing_fits_the_timeout(self) -> ProbeOptions:
        pauses = longest_pauses(self.repeats, self.spacing)
        if self.timeout <= pauses:
            raise ValueError(
                f"the probe timeout ({format_duration(self.timeout)}) must be longer than the pauses of one timing "
                f"(up to {format_duration(pauses)}: 1 + 1.5 x (repeats - 1) spacings, with repeats {self.repeats} "
                f"and spacing {format_duration(self.spacing)}); raise the timeout or lower the spacing or repeats"
            )
        return self


def probed_devices(
    devices: tuple[DeviceInfo, ...], each_cpu_device: bool = False
) -> tuple[list[DeviceInfo], dict[tuple[str, int], tuple[str, int]]]:
    """The devices to probe, and each unprobed device's stand-in: CPU devices of one process share its cores, so
    the first CPU device (lowest id) is probed for all of them (unless `each_cpu_device`); every other device is
    probed itself."""
    if each_cpu_device:
        return sorted(devices, key=lambda d: (d.platform, d.id)), {}
    cpus = sorted((d for d in devices if d.platform == "cpu"), key=lambda d: d.id)
    probed = [d for d in devices if d.platform != "cpu"] + cpus[:1]
    shared = {d.key: cpus[0].key for d in cpus[1:]}
    return sorted(probed, key=lambda d: (d.platform, d.id)), shared


@register
class ProbeCollector(Collector[ProbeOptions, ProbeState]):
    """Per-device probe runs on the scheduler; the state is every probed device's latest ProbeStatus."""

    name = "probe"
    description = "A jit-compiled probe per device (one for all CPU devices): up, latency, baseline, utilization."
    options = ProbeOptions
    order = 20
    needs_jax = True
    heartbeat = False  # each device's health is metrics.DEVICE_UP; /healthz is about fresh polls

    @classmethod
    def unavailable(cls, opts: ProbeOptions, ctx: Context) -> str | None:
        """Replayed devices cannot be probed."""
        return None if ctx.source.runs_probes else f"source {ctx.source.name} runs no probes"

    def __init__(self, opts: ProbeOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self.config = ProbeConfig(
            size=opts.size,
            timeout_seconds=opts.timeout,
            target_seconds=opts.target,
            repeats=opts.repeats,
            spacing_seconds=opts.spacing,
        )
        errors = ErrorLog(log)
        calibration_lock = threading.Lock()
        store = BaselineStore(opts.baseline_file) if opts.baseline_file is not None else None
        probed, self.shared = probed_devices(ctx.devices, opts.each_cpu_device)
        self._deferred_once = False  # the first deferral is logged, once
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
            for dev in probed
        }

    def _store_key(self, dev: DeviceInfo) -> str:
        return (
            f"{dev.platform}:{dev.id}:{dev.device_kind}|jax={package_version('jax')}"
            f"|jaxlib={package_version('jaxlib')}|size={self.config.size}|target={self.config.target_seconds:g}"
            f"|seed=warmup{WARMUP_STEPS}|spacing={self.config.spacing_seconds:g}"
        )

    def _duty_cycle(self, dev: DeviceInfo) -> float | None:
        """The device's last duty cycle from a device-wide collector (NVML, libtpu); None when none knows it."""
        for source in self.ctx.exchange.read(DUTY_CYCLES):
            duty = source.duty_cycle(dev.platform, dev.id)
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
        # CPU devices are the host's cores: the host's CPU time outside jaxmon is their device-wide reading. It only
        # picks the timings the baseline follows, never defers a calibration: on a shared host it is rarely quiet
        # enough.
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
        return self.opts.interval

    def jobs(self) -> list[PollJob]:
        """One job per probed device, each first run at once. Devices that share no hardware (GPU, TPU, the one
        CPU device probed for all) run together; CPU devices probed each on its own share the host's cores, so
        their runs are spread over the interval (at most a quarter second apart): none times another's load."""
        cpus = [p for p in self.probes.values() if p.device.platform == "cpu"]
        gap = min(self.interval / len(cpus), 0.25) if len(cpus) > 1 else 0.0
        order = {id(p): i for i, p in enumerate(cpus)}
        return [
            PollJob(
                f"probe-{probe.device.name}",
                self.interval,
                self._runner(probe),
                first_delay=0.2 + order.get(id(probe), 0) * gap,
            )
            for probe in self.probes.values()
        ]

    def _runner(self, probe: DeviceProbe) -> Callable[[], Update[ProbeState] | None]:
        def run() -> Update[ProbeState] | None:
            self._run_or_defer(probe)
            return self.current()

        return run

    def _run_or_defer(self, probe: DeviceProbe) -> None:
        """Run the probe, unless this process's job is training on its device: then jaxmon dispatches nothing."""
        if self._job_trains_on(probe.device):
            if not self._deferred_once:
                self._deferred_once = True
                log.info(
                    "the probe waits while the job trains: no program of jaxmon's runs beside the job's steps",
                    device=probe.device.name,
                    interval=format_duration(self.interval),
                )
            probe.defer()
        else:
            probe.run_once()

    def _job_trains_on(self, dev: DeviceInfo) -> bool:
        """Whether the job in this process trains on `dev` (a step of it ended within the probe interval), or on a
        device that shares its hardware: CPU devices are the host's cores, one thread pool for all of them, so a
        job on any CPU device keeps the probe off every CPU device."""
        workload = self.ctx.in_process
        if workload is None:
            return False
        training = workload.training_devices(self.interval)
        if dev.platform == "cpu":
            return any(platform == "cpu" for platform, _ in training)
        return dev.key in training

    def update(self) -> Update[ProbeState]:
        """One run on every probed device, one after the other (`jaxmon snapshot`)."""
        for probe in self.probes.values():
            self._run_or_defer(probe)
        result = self.current()
        return result if result is not None else Update(ProbeState(shared=self.shared), success=False)

    def current(self) -> Update[ProbeState] | None:
        """The statuses now; success when every device that ran answered; duration is one round's device time.
        None before any probe ran."""
        statuses = {key: probe.status() for key, probe in self.probes.items()}
        ran = [st for st in statuses.values() if st.up is not None]
        if not ran:
            return None
        return Update(
            ProbeState(statuses, self.shared),
            success=all(st.up for st in ran),
            duration_seconds=sum(st.last_duration_seconds or 0.0 for st in ran),
        )

    def _changed_outside_a_run(self) -> None:
        # A run that outlived its timeout finished on the worker thread: record what it changed.
        result = self.current()
        if result is not None:
            self.ctx.publish(result)

    def families(self, snap: Snapshot, state: ProbeState) -> Iterator[Metric]:
        """The probe families of every device: its own probe's, or (a CPU device) the shared ones of its stand-in."""
        families = {m.family.name: m.family.new() for m in PROBE_METRICS}
        targets = [
            (m.value, families[m.family.name].samples.append, sample_name(families[m.family.name]), m.shared)
            for m in PROBE_METRICS
        ]
        origin = metrics.PROBE_BASELINE_INFO.new()
        for dev in snap.devices:
            own = state.statuses.get(dev.key)
            stand_in = state.shared.get(dev.key)
            status = own if own is not None else state.statuses.get(stand_in) if stand_in is not None else None
            if status is None:
                continue
            labels = snap.device_labels(dev)
            for read, append, sname, shared in targets:
                if own is None and not shared:
                    continue
                value = read(status)
                if value is not None:
                    append(Sample(sname, labels, value))
            if own is not None and status.baseline_origin is not None:
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
