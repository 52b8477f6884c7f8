"""Settings: one model for flags, `JAXMON_*` variables, the YAML file and `jaxmon.start()` arguments.

`model` holds the core sections and `CollectorOptions`, the base of each collector's own options; `load` reads
every source; `errors` words what is wrong as the user wrote it; `help` is --help in the user's words; `aliases`
keeps old names working. Nothing here imports a collector: `jaxmon.compose` builds the model from the registry.
"""

from jaxmon.settings.durations import Duration, format_duration, parse_duration
from jaxmon.settings.load import load_settings
from jaxmon.settings.schema import (
    DEFAULT_PORT,
    CollectorOptions,
    Enabled,
    Settings,
    SettingsError,
    SettingsSection,
    parse_listen_address,
    settings_model,
)

__all__ = [
    "DEFAULT_PORT",
    "CollectorOptions",
    "Duration",
    "Enabled",
    "Settings",
    "SettingsError",
    "SettingsSection",
    "format_duration",
    "load_settings",
    "parse_duration",
    "parse_listen_address",
    "settings_model",
]
