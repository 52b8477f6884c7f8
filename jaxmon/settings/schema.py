"""The settings model: the core sections, the base of every collector's options, and the model built from both.

The `collector` section is not written here: each collector owns its options (`CollectorOptions` subclasses in its
own module), and the composition root (`jaxmon.compose`) builds the whole model from the registry with
`settings_model()`. So importing the settings imports no collector.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, create_model, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from jaxmon.settings.durations import Duration

DEFAULT_PORT = 10401

Enabled = bool | Literal["auto"]


def parse_listen_address(value: str) -> tuple[str, int]:
    """`host:port`, `:port` (all interfaces) or `[v6]:port` into (host, port)."""
    match = re.match(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d+)$", value)
    if not match:
        raise ValueError(f"expected host:port, :port or [ipv6]:port, got {value!r}")
    port = int(match.group("port"))
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0-65535")
    host = match.group("v6") or match.group("host") or "0.0.0.0"
    return host, port


class SettingsSection(BaseModel):
    """A settings section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class CollectorOptions(SettingsSection):
    """The settings section of one collector: `--collector.<name>` / `--no-collector.<name>` set `enabled`."""

    enabled: Enabled = Field(default=True, description="true, false, or auto (on where its source is present).")

    def configured(self) -> list[str]:
        """The options given explicitly, besides `enabled` (an `auto` collector that is off says so in the log)."""
        return sorted(self.model_fields_set - {"enabled"})


class WebConfigFileSettings(SettingsSection):
    """`--web.config.file`."""

    file: Path | None = Field(
        default=None, description="exporter-toolkit web config (TLS, basic auth, headers); re-read on change."
    )


class WebSettings(SettingsSection):
    """HTTP endpoint."""

    listen_address: str = Field(
        default=f":{DEFAULT_PORT}", description="Address to listen on: host:port, :port or [ipv6]:port."
    )
    telemetry_path: str = Field(default="/metrics", description="Path under which to expose metrics.")
    max_requests: int = Field(default=40, ge=1, description="Requests served at once; more are answered 503 at once.")
    header_timeout: Duration = Field(
        default=5.0, description="Connections that send no complete request (or TLS handshake) in this time close."
    )
    enable_profiling: bool = Field(
        default=False,
        description="Serve /debug/pprof/device_memory (the workload's live device buffers as a pprof profile; "
        "embedded exporter only, at most one per 5s).",
    )
    config: WebConfigFileSettings = WebConfigFileSettings()

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value

    @field_validator("telemetry_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/") or value in ("/", "/healthz", "/readyz"):
            raise ValueError("must start with / and not be /, /healthz or /readyz")
        return value


class PollSettings(SettingsSection):
    """The default interval of every collector that polls."""

    interval: Duration = Field(
        default=5.0,
        description="Time between polls of memory_stats() and the device-wide sources (500ms, 5s, 1m; a plain "
        "number is seconds).",
    )


class HealthSettings(SettingsSection):
    """/healthz."""

    max_staleness: Duration | None = Field(
        default=None,
        description="/healthz fails when the last poll is older than this (default 3 x poll interval).",
    )
    socket: Path | None = Field(
        default=None,
        description="Also answer /healthz and /readyz on this Unix socket, for `jaxmon healthcheck` (the image's "
        "HEALTHCHECK); made 0600 in a directory only the daemon's uid may enter. The image sets it.",
    )


class GpuSettings(SettingsSection):
    """Defaults applied when jaxmon itself starts a GPU backend."""

    memory_fraction: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="XLA_CLIENT_MEM_FRACTION jaxmon sets for its own GPU client unless the user set one.",
    )


class DeviceSettings(SettingsSection):
    """Which of this process's JAX devices are read."""

    include_cpu: bool = Field(
        default=False,
        description="Also read the host's CPU devices (memory, probe, device_info) where a GPU or TPU backend is up; "
        "without one they are read anyway. For jobs that place work on CPU devices on purpose.",
    )


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class LogSettings(SettingsSection):
    """Logging."""

    # JAXMON_LOG__LEVEL=DEBUG is how people write levels (Python's own names are upper case).
    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = Field(
        default="info", description="Log level."
    )
    format: Annotated[Literal["auto", "json", "console"], BeforeValidator(_lower)] = Field(
        default="auto", description="json, console, or auto (json when stderr is not a TTY)."
    )


class PathSettings(SettingsSection):
    """Where the host's pseudo-filesystems are (node_exporter's `--path.procfs` and `--path.sysfs`)."""

    procfs: Path = Field(
        default=Path("/proc"),
        description="procfs mount point: the processes NVML reports are read here (their cgroup: pod or Slurm job); "
        "in a container, the host's /proc with hostPID.",
    )
    sysfs: Path = Field(
        default=Path("/sys"), description="sysfs mount point: the cgroup tree under fs/cgroup (Slurm's, for auto)."
    )


class ConfigSettings(SettingsSection):
    """The YAML config file."""

    file: Path | None = Field(default=None, description="YAML file with any of these settings.")


class CollectorSettings(SettingsSection):
    """Which collectors run, and each one's options (the fields come from the registry: `settings_model`)."""


class Settings(BaseSettings):
    """Everything `jaxmon serve` and `jaxmon snapshot` can be told (the `collector` section: `settings_model`)."""

    # How pydantic-settings spells the flags (jaxmon.settings.load reads every source itself).
    model_config = SettingsConfigDict(
        extra="forbid",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
    )

    web: WebSettings = WebSettings()
    collector: CollectorSettings = CollectorSettings()
    poll: PollSettings = PollSettings()
    health: HealthSettings = HealthSettings()
    gpu: GpuSettings = GpuSettings()
    devices: DeviceSettings = DeviceSettings()
    log: LogSettings = LogSettings()
    path: PathSettings = PathSettings()
    config: ConfigSettings = ConfigSettings()
    replay: Path | None = Field(default=None, description="Serve recorded devices from this JSON file.")
    node: bool = Field(
        default=False,
        description="Node mode: only the device-wide collectors (NVML, libtpu, the kubelet's pods), the memory and "
        "probe collectors off, so JAX is never imported (a DaemonSet on every accelerator node).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the loader passes in: it reads flags, variables and the file itself (jaxmon.settings.load)."""
        return (init_settings,)

    # What the loader noticed that the user should read once logging is up (old setting names in use).
    _notes: list[str] = PrivateAttr(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """Remarks about how the settings were given (e.g. an old name), for the log."""
        return self._notes

    def collector_options(self, name: str) -> CollectorOptions:
        """The settings section of the collector `name`."""
        options: CollectorOptions = getattr(self.collector, name)
        return options

    @property
    def max_staleness(self) -> float:
        """Seconds after which data counts as stale for /healthz."""
        return self.health.max_staleness or 3 * self.poll.interval


class SettingsError(ValueError):
    """Invalid settings; the message names each setting as the user gave it and what is wrong."""


def _enabled_shorthand(value: Any) -> Any:
    """`collector: {probe: false}` (YAML) and `JAXMON_COLLECTOR__PROBE=false` mean `enabled: false`."""
    if isinstance(value, bool) or value in ("auto", "true", "false"):
        return {"enabled": value}
    return value


@lru_cache(maxsize=8)
def _model(options: tuple[tuple[str, type[CollectorOptions]], ...]) -> type[Settings]:
    fields: dict[str, Any] = {
        name: (Annotated[cls, BeforeValidator(_enabled_shorthand)], cls()) for name, cls in options
    }
    section = create_model("CollectorSettings", __base__=CollectorSettings, **fields)
    return create_model("Settings", __base__=Settings, collector=(section, section()))


def settings_model(options: Mapping[str, type[CollectorOptions]]) -> type[Settings]:
    """The whole settings model with one `collector.<name>` section per collector (`options`, in order)."""
    return _model(tuple(options.items()))
