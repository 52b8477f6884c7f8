"""One settings model for CLI flags, JAXMON_* environment variables and the YAML config file.

Precedence, highest first: command-line flags, environment variables, the YAML file (`--config.file` or
`JAXMON_CONFIG__FILE`), built-in defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from jaxmon.collectors.base import CollectorOptions

# parse_duration is re-exported: callers (and tests) have always imported it from here.
from jaxmon.durations import Duration
from jaxmon.durations import parse_duration as parse_duration
from jaxmon.probe import longest_pauses

DEFAULT_PORT = 10401


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


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebConfigFileSettings(_Section):
    """`--web.config.file`."""

    file: Path | None = Field(
        default=None, description="exporter-toolkit web config (TLS, basic auth, headers); re-read on change."
    )


class WebSettings(_Section):
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


def _enabled_shorthand(value: Any) -> Any:
    """`collector: {probe: false}` (YAML) and `JAXMON_COLLECTOR__PROBE=false` mean `enabled: false`."""
    if isinstance(value, bool) or value == "auto":
        return {"enabled": value}
    return value


def _collector_settings() -> type[BaseModel]:
    """One section per registered collector (`--collector.<name>.*`), built from the registry."""
    from jaxmon.collectors import registry

    fields: dict[str, Any] = {
        name: (Annotated[cls.options, BeforeValidator(_enabled_shorthand)], cls.options())
        for name, cls in registry().items()
    }
    return create_model("CollectorSettings", __base__=_Section, __doc__="Which collectors run.", **fields)


if TYPE_CHECKING:
    CollectorSettings = _Section
else:
    CollectorSettings = _collector_settings()


class PollSettings(_Section):
    """memory_stats() polling."""

    interval: Duration = Field(
        default=5.0, description="Time between memory_stats() polls (500ms, 5s, 1m; a plain number is seconds)."
    )


class ProbeSettings(_Section):
    """The utilization probe."""

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
    spacing: Duration = Field(
        default=0.1,
        le=1.0,
        description="Pause between the shots of one timing (and between calibration seeds).",
    )
    baseline_file: Path | None = Field(
        default=None,
        description="Keep each device's idle calibration here; a restart reuses a matching one instead of "
        "calibrating while training may already be running.",
    )

    @field_validator("spacing")
    @classmethod
    def _timing_fits_the_timeout(cls, spacing: float, info: ValidationInfo) -> float:
        timeout, repeats = info.data.get("timeout"), info.data.get("repeats")
        if timeout is not None and repeats is not None and timeout <= longest_pauses(repeats, spacing):
            raise ValueError(
                f"the pauses of one timing (up to {longest_pauses(repeats, spacing):g}s: 1 + 1.5 x "
                f"(probe.repeats - 1) spacings) must be shorter than probe.timeout ({timeout:g}s)"
            )
        return spacing


class HealthSettings(_Section):
    """/healthz."""

    max_staleness: Duration | None = Field(
        default=None,
        description="/healthz fails when the last poll is older than this (default 3 x poll interval).",
    )


class GpuSettings(_Section):
    """Defaults applied when jaxmon itself starts a GPU backend."""

    memory_fraction: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="XLA_CLIENT_MEM_FRACTION jaxmon sets for its own GPU client unless the user set one.",
    )


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class LogSettings(_Section):
    """Logging."""

    # JAXMON_LOG__LEVEL=DEBUG is how people write levels (Python's own names are upper case).
    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = Field(
        default="info", description="Log level."
    )
    format: Annotated[Literal["auto", "json", "console"], BeforeValidator(_lower)] = Field(
        default="auto", description="json, console, or auto (json when stderr is not a TTY)."
    )


class SpoolSettings(_Section):
    """Publisher + sidecar: the shared directory workload processes publish to."""

    dir: Path | None = Field(default=None, description="Aggregate workload snapshots published to this directory.")
    ttl: Duration = Field(
        default=30.0, description="A workload whose file was not rewritten for longer than this disappears."
    )
    max_file_bytes: int = Field(default=1 << 20, ge=1024, description="Larger spool files are rejected.")
    max_workloads: int = Field(
        default=128,
        ge=1,
        le=100_000,
        description="At most this many workload processes (live files, in name order) are exported; the rest are "
        "counted in jaxmon_spool_overflow_files_total.",
    )
    max_reads_per_poll: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="At most this many new or changed spool files are read per poll; the rest wait for the next.",
    )
    remove_after: Duration | None = Field(
        default=None,
        description="Publisher files and crashed writers' temporary files older than this are removed where the "
        "sidecar may write (default 10 x ttl).",
    )

    @field_validator("dir")
    @classmethod
    def _check_dir(cls, value: Path | None) -> Path | None:
        # A missing directory may still appear (the trainer creates it); something else in its place never works.
        if value is not None and value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a directory")
        return value


class ConfigSettings(_Section):
    """The YAML config file."""

    file: Path | None = Field(default=None, description="YAML file with any of these settings.")


class Settings(BaseSettings):
    """Everything `jaxmon serve` and `jaxmon snapshot` can be told."""

    model_config = SettingsConfigDict(
        env_prefix="JAXMON_",
        env_nested_delimiter="__",
        extra="forbid",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        nested_model_default_partial_update=True,
    )

    web: WebSettings = WebSettings()
    collector: CollectorSettings = CollectorSettings()
    poll: PollSettings = PollSettings()
    probe: ProbeSettings = ProbeSettings()
    health: HealthSettings = HealthSettings()
    gpu: GpuSettings = GpuSettings()
    log: LogSettings = LogSettings()
    spool: SpoolSettings = SpoolSettings()
    config: ConfigSettings = ConfigSettings()
    replay: Path | None = Field(default=None, description="Serve recorded devices from this JSON file.")

    def collector_options(self, name: str) -> CollectorOptions:
        """The settings section of the collector `name`."""
        options: CollectorOptions = getattr(self.collector, name)
        return options

    @property
    def max_staleness(self) -> float:
        """Seconds after which data counts as stale for /healthz."""
        return self.health.max_staleness or 3 * self.poll.interval


class SettingsError(ValueError):
    """Invalid settings; the message names each setting and what is wrong."""


class _YamlSource(PydanticBaseSettingsSource):
    """The YAML file's contents as a settings source (strict: it must be a mapping)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"config.file: cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"config.file: {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config.file: {path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def _config_file_from(argv: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--config.file" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--config.file="):
            return Path(arg.split("=", 1)[1])
    value = environ.get("JAXMON_CONFIG__FILE")
    return Path(value) if value else None


_COLLECTOR_FLAG = re.compile(r"^--(no-)?collector\.([a-z0-9_]+)(?:=(.*))?$")


def collector_flags(argv: Sequence[str]) -> list[str]:
    """node_exporter's flags: `--collector.X`, `--no-collector.X`, `--collector.X=auto` set `collector.X.enabled`."""
    from jaxmon.collectors import registry

    names = registry()
    out: list[str] = []
    for arg in argv:
        match = _COLLECTOR_FLAG.match(arg)
        if match is None or match.group(2) not in names:
            out.append(arg)
            continue
        negated, name, value = match.groups()
        if negated:
            value = "false" if value is None else value
        out.append(f"--collector.{name}.enabled={'true' if value is None else value}")
    return out


def load_settings(
    argv: Sequence[str],
    prog: str = "jaxmon serve",
    help_extra: Sequence[tuple[str, str]] = (),
    help_hidden: Callable[[str], bool] = lambda flag: False,
) -> Settings:
    """Build Settings from argv, the environment and the YAML file; raises SettingsError on bad input.

    argparse errors (unknown flags, missing values) exit with status 2 themselves, as argparse does. `help_extra`
    (flag, help) are the command's own flags, listed in --help (the caller parses them); `help_hidden` flags are
    accepted but left out of --help.
    """
    from jaxmon.clihelp import help_hook
    from jaxmon.settings_check import describe, yaml_problems

    argv = collector_flags(argv)
    config_path = _config_file_from(argv, os.environ)
    yaml_data = _read_yaml(config_path) if config_path is not None else {}
    problems = yaml_problems(yaml_data, Settings)
    if problems:
        raise SettingsError(f"invalid settings (config file {config_path}):\n  " + "\n  ".join(problems))

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            cli: CliSettingsSource[Any] = CliSettingsSource(
                settings_cls,
                cli_prog_name=prog,
                cli_parse_args=list(argv),
                add_argument_method=help_hook(Settings, help_hidden, help_extra),
            )
            return (cli, env_settings, _YamlSource(settings_cls, yaml_data))

    origin = f" (config file {config_path})" if config_path else ""
    try:
        loaded = _Loaded()
    except ValidationError as exc:
        raise SettingsError(describe(exc, "cli", origin)) from exc
    except SystemExit:
        if "-h" in argv or "--help" in argv:
            print(collectors_help())
        raise
    return Settings.model_validate(loaded.model_dump())


def collectors_help() -> str:
    """The collectors section of --help: node_exporter-style flags and what each collector does."""
    from jaxmon.collectors import registry

    lines = ["collectors (each is also --collector.NAME.enabled {true,false,auto}):"]
    for name, cls in registry().items():
        default = cls.options().enabled
        shown = "auto" if default == "auto" else str(default).lower()
        lines.append(f"  --collector.{name} / --no-collector.{name}  (default: {shown})")
        lines.append(f"      {cls.description}")
    return "\n".join(lines)


def warn_unused_environment(environ: Mapping[str, str] | None = None) -> None:
    """Log each JAXMON_* variable that sets nothing (a typo, or one underscore where two are needed)."""
    import structlog

    from jaxmon.settings_check import unused_environment

    log = structlog.get_logger("jaxmon.settings")
    for variable, hint in unused_environment(os.environ if environ is None else environ, Settings):
        log.warning("environment variable sets nothing", variable=variable, hint=hint)
