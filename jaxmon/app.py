"""The composition root: settings → device source → collectors → runtime, for every entry point.

`jaxmon serve` and `jaxmon snapshot` (cli), `jaxmon.start()` (embedded) and `jaxmon.publish()` (publisher) build
what they run here; no library module imports the CLI.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

import structlog

from jaxmon.collectors import registry
from jaxmon.collectors.base import Collector, Context
from jaxmon.runtime import Runtime
from jaxmon.settings import Settings
from jaxmon.sources import DeviceSource, InProcess
from jaxmon.sources.faults import Faults, FaultySource
from jaxmon.sources.replay import ReplaySource

log = structlog.get_logger("jaxmon")


def package_version(dist: str) -> str:
    """The installed version of `dist`, or "unknown"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info() -> dict[str, str]:
    """Versions for jaxmon_build_info, read from package metadata (no JAX import needed)."""
    return {
        "version": package_version("jaxmon"),
        "jax_version": package_version("jax"),
        "jaxlib_version": package_version("jaxlib"),
        "python_version": platform.python_version(),
    }


def _with_faults(source: DeviceSource) -> DeviceSource:
    faults = Faults.from_env()
    return source if faults.inactive else FaultySource(source, faults)


def make_source(settings: Settings) -> DeviceSource:
    """Replay file when one is given, else this process's JAX devices with a sidecar's GPU defaults."""
    if settings.replay is not None:
        return _with_faults(ReplaySource(settings.replay))
    from jaxmon.sources.local import LocalSource  # imports JAX: only when local devices are wanted

    return _with_faults(LocalSource(settings.gpu.memory_fraction))


def workload_source() -> tuple[DeviceSource, InProcess]:
    """Inside a training process: its own JAX (none of its settings changed) and its live arrays and compiles."""
    from jaxmon.sources.local import InProcessWorkload, LocalSource

    local = LocalSource(sidecar_defaults=False)
    return _with_faults(local), InProcessWorkload(local)


def select_collectors(ctx: Context) -> tuple[list[Collector[Any]], dict[str, str]]:
    """The collectors to run, and those asked for explicitly that cannot run here (with the reason)."""
    running: list[Collector[Any]] = []
    unavailable: dict[str, str] = {}
    for name, cls in registry().items():
        options = ctx.settings.collector_options(name)
        if options.enabled is False:
            continue
        reason = cls.unavailable(ctx)
        if reason is not None:
            if options.enabled is True:
                unavailable[name] = reason
            else:
                log.debug("collector off: not available here", collector=name, reason=reason)
            continue
        running.append(cls(ctx, options))
    return running, unavailable


def build_runtime(
    settings: Settings,
    source: DeviceSource | None = None,
    workload: str | None = None,
    in_process: InProcess | None = None,
) -> Runtime:
    """Discover the devices and build the runtime with every collector the settings and the machine allow."""
    source = make_source(settings) if source is None else source
    devices, backends = source.discover()
    for backend in backends:
        if not backend.up:
            log.warning("backend unavailable", backend=backend.name, error=backend.error)
    log.info(
        "devices discovered",
        source=source.name,
        devices=[d.name for d in devices],
        backends={b.name: b.up for b in backends},
    )
    ctx = Context(settings=settings, source=source, devices=devices, workload=workload, in_process=in_process)
    collectors, unavailable = select_collectors(ctx)
    log.info("collectors", running=[c.name for c in collectors], unavailable=unavailable or None)
    return Runtime(ctx, backends, collectors, build_info(), settings.max_staleness, unavailable)
