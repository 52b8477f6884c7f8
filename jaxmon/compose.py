"""The composition root: settings → device source → collectors → runtime, for every entry point.

`jaxmon serve` and `jaxmon snapshot` (cli), `jaxmon.start()` (embedded) and `jaxmon.publish()` (publisher) build
what they run here; no library module imports the CLI, and no collector imports another or this module. The
settings model is built here from the registry (each collector owns its options), and the cross-collector
readings (`jaxmon.exchange`) and the owner transform (`jaxmon.ownership.owners`) are wired here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog

from jaxmon.collectors import registry
from jaxmon.collectors.base import AnyCollector, Context
from jaxmon.exchange import WORKLOAD_PIDS, Exchange
from jaxmon.identity import host_name, scheduler_labels
from jaxmon.ownership.owners import OwnerTransform
from jaxmon.runtime import Recorder, Runtime
from jaxmon.settings import Settings, SettingsError, settings_model
from jaxmon.settings import load_settings as _load
from jaxmon.settings.errors import unused_environment
from jaxmon.snapshot import Snapshot
from jaxmon.sources import DeviceSource, InProcess
from jaxmon.sources.faults import Faults, FaultySource
from jaxmon.sources.node import NodeSource
from jaxmon.sources.replay import ReplaySource
from jaxmon.sources.selection import select_devices
from jaxmon.versions import build_info

log = structlog.get_logger("jaxmon")


def model() -> type[Settings]:
    """The settings model: the core sections and one `collector.<name>` section per registered collector."""
    return settings_model({name: cls.options for name, cls in registry().items()})


def load_settings(argv: Sequence[str] = (), **options: Any) -> Settings:
    """Settings from flags (`argv`), `JAXMON_*` variables and the YAML file (jaxmon.settings.load); `--node` turns
    the collectors that read this process's JAX devices off."""
    settings = _load(model(), argv, help_epilog=collectors_help, **options)
    if settings.node:
        for name, cls in registry().items():
            if not cls.needs_jax:
                continue
            collector = settings.collector_options(name)
            if collector.enabled is True and "enabled" in collector.model_fields_set:
                raise SettingsError(
                    f"invalid settings:\n  --node: node mode runs no collector that needs JAX, and collector "
                    f"{name} does: drop --collector.{name} (or --node)"
                )
            collector.enabled = False
    return settings


def default_settings() -> Settings:
    """The defaults, with nothing read from the environment."""
    return model()()


def collectors_help() -> str:
    """The collectors section of --help: node_exporter-style flags and what each collector does."""
    lines = ["collectors (each is also --collector.NAME.enabled {true,false,auto}):"]
    for name, cls in registry().items():
        default = cls.options().enabled
        shown = "auto" if default == "auto" else str(default).lower()
        lines.append(f"  --collector.{name} / --no-collector.{name}  (default: {shown})")
        lines.append(f"      {cls.description}")
    return "\n".join(lines)


def log_settings_notes(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Once logging is up: old setting names in use, and each JAXMON_* variable that sets nothing."""
    for note in settings.notes:
        log.info("old setting name", note=note)
    for variable, hint in unused_environment(os.environ if environ is None else environ, model()):
        log.warning("environment variable sets nothing", variable=variable, hint=hint)


def _with_faults(source: DeviceSource) -> DeviceSource:
    faults = Faults.from_env()
    return source if faults.inactive else FaultySource(source, faults)


def needs_jax(settings: Settings) -> bool:
    """Whether a collector that reads this process's own JAX devices may run."""
    return any(
        cls.needs_jax and settings.collector_options(name).enabled is not False for name, cls in registry().items()
    )


def make_source(settings: Settings) -> DeviceSource:
    """Replay file when one is given; this process's JAX devices (with a sidecar's GPU defaults) where a collector
    reads them; else no devices at all, and JAX is never imported (node mode)."""
    if settings.replay is not None:
        return _with_faults(ReplaySource(settings.replay))
    if not needs_jax(settings):
        log.info("node mode: no collector reads JAX devices, so JAX is not imported")
        return NodeSource()
    from jaxmon.sources.local import LocalSource  # imports JAX: only when local devices are wanted

    return _with_faults(LocalSource(settings.gpu.memory_fraction))


def workload_source(settings: Settings) -> tuple[DeviceSource, InProcess]:
    """Inside a training process: its own JAX (none of its settings changed), its live arrays and compiles, and
    the training tracker that jaxmon.step() feeds (made with the training collector's options)."""
    from jaxmon.sources.local import LocalSource
    from jaxmon.sources.local.private import forked_backends
    from jaxmon.sources.local.training import JaxTraining
    from jaxmon.sources.local.workload import InProcessWorkload
    from jaxmon.training import activate

    local = LocalSource(sidecar_defaults=False)
    options = settings.collector_options("training")
    tracker = None
    if options.enabled is not False and forked_backends():
        log.warning(
            "training telemetry is off in this process: it was forked after JAX started, and JAX cannot run in it "
            "(its runtime's threads did not survive os.fork()); start it with multiprocessing's spawn or forkserver "
            "to track its steps"
        )
    elif options.enabled is not False:
        config = options.tracker_config()  # type: ignore[attr-defined]  # TrainingOptions
        tracker = activate(lambda: JaxTraining(local), config)
    kinds = getattr(options, "badput_kinds", ())  # TrainingOptions: declared badput kinds, born at 0
    return _with_faults(local), InProcessWorkload(local, tracker, kinds)


def select_collectors(
    settings: Settings, context: Callable[[str], Context]
) -> tuple[list[AnyCollector], dict[str, str]]:
    """The collectors to run, and those asked for explicitly that cannot run here (with the reason).

    An `auto` collector that cannot run here is off; when options of it were given (`--collector.tpu.address`),
    the `collectors` log line names it and says why.
    """
    running: list[AnyCollector] = []
    unavailable: dict[str, str] = {}
    configured_off: dict[str, str] = {}
    for name, cls in registry().items():
        options = settings.collector_options(name)
        if options.enabled is False:
            continue
        ctx = context(name)
        reason = cls.unavailable(options, ctx)
        if reason is not None:
            if options.enabled is True:
                unavailable[name] = reason
            elif options.configured():
                given = ", ".join(f"collector.{name}.{option}" for option in options.configured())
                configured_off[name] = f"{reason} ({given} set; --collector.{name} runs it anyway)"
            else:
                log.debug("collector off: not available here", collector=name, reason=reason)
            continue
        running.append(cls(options, ctx))
    log.info(
        "collectors",
        running=[c.name for c in running],
        unavailable=unavailable or None,
        configured_but_off=configured_off or None,
    )
    return running, unavailable


def build_runtime(
    settings: Settings,
    source: DeviceSource | None = None,
    workload: str | None = None,
    in_process: InProcess | None = None,
) -> Runtime:
    """Discover the devices and build the runtime with every collector the settings and the machine allow."""
    source = make_source(settings) if source is None else source
    discovered, backends = source.discover()
    devices, left_out = select_devices(discovered, settings.devices.include_cpu)
    for backend in backends:
        if not backend.up:
            log.warning("backend unavailable", backend=backend.name, error=backend.error)
    log.info(
        "devices discovered",
        source=source.name,
        devices=[d.name for d in devices],
        backends={b.name: b.up for b in backends},
        host_cpu_left_out=[d.name for d in left_out] or None,  # --devices.include-cpu reads them
    )
    workload_info: dict[str, str] = {}
    if workload is not None and in_process is not None:
        workload_info = {
            "workload": workload,
            "process_index": str(in_process.process_index),
            "host": host_name(),
            "pid": str(os.getpid()),
            "jax_version": in_process.jax_version,
            **scheduler_labels(),
        }
    recorder = Recorder(
        Snapshot(
            devices=tuple(devices),
            backends=tuple(backends),
            source=source.name,
            build=build_info(),
            workload=workload,
            workload_info=workload_info,
        )
    )
    exchange = Exchange(recorder.snapshot)
    if workload is not None:
        exchange.constant(WORKLOAD_PIDS, {os.getpid(): workload})  # this process is the workload
    base = Context(
        source=source,
        devices=tuple(devices),
        exchange=exchange,
        poll_interval=settings.poll.interval,
        workload=workload,
        in_process=in_process,
        procfs=settings.path.procfs,
        sysfs=settings.path.sysfs,
    )
    collectors, unavailable = select_collectors(settings, lambda name: replace(base, publish=recorder.publisher(name)))
    for collector in collectors:
        for channel, read in collector.offers.items():
            exchange.offer(channel, collector.name, read)
    # Who owns each series' device or process: one step over every collector's families (jaxmon.ownership.owners).
    transform = OwnerTransform(exchange)
    return Runtime(recorder, collectors, settings.max_staleness, unavailable, in_process, transform)
