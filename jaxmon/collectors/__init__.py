"""The collectors: one module each, found by the registry, each turned into `--collector.<name>` flags.

Adding a collector is adding a module here with a `@register`ed `Collector` subclass (and its test file): the
settings gain its section, the runtime schedules it and records its health, the exposition renders it, and
`/metrics?collect[]=<name>` selects it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from jaxmon.collectors.base import AnyCollector

C = TypeVar("C", bound=type[AnyCollector])

_REGISTRY: dict[str, type[AnyCollector]] = {}


def register(cls: C) -> C:
    """Class decorator: make `cls` a collector jaxmon knows (its name must be unique)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two collectors named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[AnyCollector]]:
    """Every collector, in exposition order (imports each module of this package once)."""
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(_REGISTRY.items(), key=lambda item: (item[1].order, item[0])))
