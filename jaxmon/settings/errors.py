"""Settings errors in the user's terms: the flag, variable, YAML key or start() argument as it was written, what is
wrong with it, and what was probably meant.

pydantic reports every source alike (its `Value error,` prefix, the value twice, a dotted location that is no
flag); the loader records where each setting came from (`Origin`) and these functions speak in those words.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

import jaxmon.settings.aliases as aliases
from jaxmon.settings.fields import Path_, dotted, leaves, sections, submodel, variable

Source = Literal["flag", "environment", "file", "argument"]

# JAXMON_* variables read outside the settings model: by jaxmon (faults, top), its test and bench tools, and the
# demo's docker-compose.yml; a shell that exports them for those must not make every daemon warn.
OTHER_VARIABLES = (
    "JAXMON_FAULTS_FILE",
    "JAXMON_TOP_PASSWORD",
    "JAXMON_UPDATE_GOLDEN",
    "JAXMON_BENCH_RESULTS",
    "JAXMON_DEMO_ADDRESS",
    "JAXMON_DEMO_PORT",
    "JAXMON_DEMO_SIDECAR_PORT",
)


@dataclass(frozen=True)
class Origin:
    """Where one setting came from, as the user wrote it."""

    source: Source
    spelling: str  # --probe.interval, JAXMON_PROBE__INTERVAL, probe.interval

    def __str__(self) -> str:
        return self.spelling


Origins = dict[Path_, Origin]


def suggestion(word: str, choices: Iterable[str], prefix: str = "", cutoff: float = 0.6) -> str:
    """` (did you mean PREFIX+X?)` for the choice X closest to `word`, or nothing."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=cutoff)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def config_problems(
    data: Mapping[str, Any], model: type[BaseModel], where: str = "", path: Path_ = (), spelled: Path_ = ()
) -> list[str]:
    """Keys of a YAML file (or start() arguments) that name no setting, as written, with what was probably meant.

    `path` is the current path of the section being read, `spelled` the user's spelling of it (an old name maps
    to its current section but is reported as written).
    """
    problems: list[str] = []
    fields = list(model.model_fields)
    for key, value in data.items():
        key = str(key)
        here = (*spelled, key)
        current = aliases.current_path((key,)) if not path else (*path, key)
        sub: type[BaseModel] | None = None
        if not path and current != (key,):
            sub = _section(model, current)
        elif key in model.model_fields:
            sub = submodel(model, key)
        else:
            underscored = key.replace("-", "_")
            if underscored in model.model_fields:
                problems.append(
                    f"{dotted(here)}{where}: YAML keys use underscores: write {underscored} "
                    f"(--{dotted((*spelled, key))} is the command-line spelling)"
                )
            else:
                choices = fields + (list(aliases.SECTIONS) if not path else [])
                hint = suggestion(key, choices, dotted(spelled) + "." if spelled else "")
                problems.append(f"{dotted(here)}{where}: no such setting{hint}")
            continue
        if sub is not None and isinstance(value, Mapping):
            problems.extend(config_problems(value, sub, where, current, here))
    return problems


def _section(model: type[BaseModel], path: Path_) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for name in path:
        if current is None or name not in current.model_fields:
            return None
        current = submodel(current, name)
    return current


# pydantic's words for a bound, in plain ones.
_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "greater_than": ("gt", "must be more than {}"),
    "less_than": ("lt", "must be less than {}"),
}


def _message(error: Mapping[str, Any]) -> str:
    msg = str(error["msg"])
    bound = _BOUNDS.get(str(error.get("type")))
    if bound is not None and bound[0] in (error.get("ctx") or {}):
        limit = error["ctx"][bound[0]]
        msg = bound[1].format(f"{limit:g}" if isinstance(limit, float) else limit)
    for noise in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(noise)
    if error.get("type") == "extra_forbidden":
        return "no such setting"
    given = error.get("input")
    if isinstance(given, (dict, list)) or repr(given) in msg or (isinstance(given, str) and given in msg):
        return msg  # the value is in the message already, or too big to repeat
    return f"{msg} (got {given!r})"


def _where(loc: Path_, origins: Mapping[Path_, Origin]) -> str:
    """The setting at `loc` as the user gave it."""
    if loc in origins:
        return str(origins[loc])
    for n in range(len(loc) - 1, 0, -1):  # a whole section given at once (JAXMON_WEB='{...}')
        given = origins.get(loc[:n])
        if given is not None:
            return f"{given} ({dotted(loc[n:])})"
    below = [str(g) for path, g in sorted(origins.items()) if path[: len(loc)] == loc and len(path) > len(loc)]
    return ", ".join(below) if below else dotted(loc) or "settings"  # a check across a section's settings


def describe(err: ValidationError, origins: Mapping[Path_, Origin], title: str = "invalid settings") -> str:
    """One line per error: the setting as the user gave it, and what is wrong, in plain words."""
    lines = []
    for e in err.errors():
        # Union members add their type as a location step (`function-after[...]`); they are no setting names.
        loc = tuple(str(p) for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in ("str", "bool"))))
        lines.append(f"{_where(loc, origins)}: {_message(e)}")
    return f"{title}:\n  " + "\n  ".join(lines)


def environment_names(model: type[BaseModel]) -> set[str]:
    """Every JAXMON_* variable that sets something: each section (as JSON) and each setting, old names too."""
    paths = set(sections(model)) | {path for path, _ in leaves(model)}
    names = {variable(p) for p in paths}
    for p in paths:
        old = aliases.old_path(p)
        if old is not None:
            names.add(variable(old))
    return names


def unused_environment(environ: Mapping[str, str], model: type[BaseModel]) -> list[tuple[str, str]]:
    """(variable, hint) for each JAXMON_* variable outside every section (those inside one are errors)."""
    known = environment_names(model) | set(OTHER_VARIABLES)
    tops = set(model.model_fields) | set(aliases.SECTIONS)
    out = []
    for var in sorted(environ):
        upper = var.upper()
        if not upper.startswith("JAXMON_") or upper in known:
            continue
        if upper[len("JAXMON_") :].split("__")[0].lower() in tops and "__" in upper:
            continue  # inside a section: the loader reports it as an error
        nested = sorted(k for k in known if k.replace("__", "_") == upper)
        if nested:
            hint = f"did you mean {nested[0]}? nested settings take two underscores"
        else:
            close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
            hint = f"did you mean {close[0]}?" if close else "no setting has this name (jaxmon serve --help lists them)"
        out.append((var, hint))
    return out
