"""Walking the settings model: its sections and leaf settings, and how each is spelled as a flag or a variable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo

Path_ = tuple[str, ...]
ENV_PREFIX = "JAXMON_"


def submodel(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model of section `name` of `model`, None when `name` is a leaf setting."""
    annotation = model.model_fields[name].annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def lookup(model: type[BaseModel], path: Path_) -> type[BaseModel] | FieldInfo | None:
    """The section model or leaf field at `path`, None when nothing is there."""
    current: type[BaseModel] = model
    for i, name in enumerate(path):
        if name not in current.model_fields:
            return None
        sub = submodel(current, name)
        if i == len(path) - 1:
            return sub if sub is not None else current.model_fields[name]
        if sub is None:
            return None
        current = sub
    return current


def leaves(model: type[BaseModel], prefix: Path_ = ()) -> Iterator[tuple[Path_, FieldInfo]]:
    """Every leaf setting of `model`, depth first, with its path."""
    for name, info in model.model_fields.items():
        sub = submodel(model, name)
        if sub is not None:
            yield from leaves(sub, (*prefix, name))
        else:
            yield (*prefix, name), info


def sections(model: type[BaseModel], prefix: Path_ = ()) -> Iterator[Path_]:
    """Every section of `model` (not the root), depth first."""
    for name in model.model_fields:
        sub = submodel(model, name)
        if sub is not None:
            yield (*prefix, name)
            yield from sections(sub, (*prefix, name))


def is_switch(info: FieldInfo) -> bool:
    """A plain bool: a flag without a value (`--x` / `--no-x`)."""
    return info.annotation is bool


def flag(path: Path_) -> str:
    """`--web.listen-address` for ("web", "listen_address")."""
    return "--" + ".".join(part.replace("_", "-") for part in path)


def path_of_flag(name: str) -> Path_:
    """The path a flag spells (`--web.listen-address` -> ("web", "listen_address")); no `--no-` handling."""
    return tuple(part.replace("-", "_") for part in name.removeprefix("--").split("."))


def variable(path: Path_) -> str:
    """`JAXMON_WEB__LISTEN_ADDRESS` for ("web", "listen_address")."""
    return ENV_PREFIX + "__".join(part.upper() for part in path)


def dotted(path: Path_) -> str:
    """`web.listen_address`: the YAML (and start()) spelling."""
    return ".".join(path)


def has_arm(info: FieldInfo, value: Any) -> bool:
    """Whether the field's annotation is a union with a Literal arm allowing `value` (e.g. "auto")."""
    return any(value in get_args(arm) for arm in get_args(info.annotation))
