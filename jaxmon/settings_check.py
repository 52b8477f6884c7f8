"""Settings errors in the user's terms: which flag, YAML key, environment variable or start() argument is wrong.

pydantic reports every source alike (an unknown YAML key as an extra input with a flag-like name, its own
`Value error,` prefix, the value twice); these name what the user wrote, where, and what was probably meant.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

Origin = Literal["cli", "start"]
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


def _submodel(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    annotation = model.model_fields[name].annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _suggest(word: str, choices: list[str], prefix: str) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {prefix}{close[0]}?)"
    return f" (known here: {', '.join(choices)})"


def yaml_problems(data: Mapping[str, Any], model: type[BaseModel], path: tuple[str, ...] = ()) -> list[str]:
    """Keys of a YAML config that name no setting, with what was probably meant."""
    problems: list[str] = []
    fields = list(model.model_fields)
    for key, value in data.items():
        dotted = ".".join((*path, str(key)))
        prefix = ".".join(path) + "." if path else ""
        if key in model.model_fields:
            sub = _submodel(model, key)
            if sub is not None and isinstance(value, Mapping):
                problems.extend(yaml_problems(value, sub, (*path, key)))
            continue
        underscored = str(key).replace("-", "_")
        if underscored in model.model_fields:
            problems.append(
                f"{dotted}: YAML keys use underscores: write {underscored} "
                f"(--{prefix}{key!s} is the command-line spelling)"
            )
        else:
            problems.append(f"{dotted}: no such setting{_suggest(str(key), fields, prefix)}")
    return problems


def _message(error: Mapping[str, Any]) -> str:
    msg = str(error["msg"])
    for noise in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(noise)
    if error.get("type") == "extra_forbidden":
        return "no such setting"
    given = error.get("input")
    if isinstance(given, (dict, list)) or repr(given) in msg or (isinstance(given, str) and given in msg):
        return msg  # the value is in the message already, or too big to repeat
    return f"{msg} (got {given!r})"


def describe(err: ValidationError, origin: Origin, where: str = "") -> str:
    """One line per error: the setting (and its flag on the command line) and what is wrong, in plain words."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "settings"
        name = f"{loc} (--{loc.replace('_', '-')})" if origin == "cli" else loc
        lines.append(f"{name}: {_message(e)}")
    return f"invalid settings{where}:\n  " + "\n  ".join(lines)


def environment_names(model: type[BaseModel], prefix: str = "JAXMON_") -> Iterator[str]:
    """Every JAXMON_* variable that sets something: each section (as JSON) and each setting, nested with `__`."""
    for name in model.model_fields:
        var = prefix + name.upper()
        yield var
        sub = _submodel(model, name)
        if sub is not None:
            yield from environment_names(sub, var + "__")


def unused_environment(environ: Mapping[str, str], model: type[BaseModel]) -> list[tuple[str, str]]:
    """(variable, hint) for each JAXMON_* variable that sets nothing (pydantic-settings ignores them silently)."""
    known = set(environment_names(model)) | set(OTHER_VARIABLES)
    out = []
    for var in sorted(environ):
        upper = var.upper()
        if not upper.startswith("JAXMON_") or upper in known:
            continue
        nested = [k for k in known if k.replace("__", "_") == upper]
        if nested:
            hint = f"did you mean {nested[0]}? nested settings take two underscores"
        else:
            close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
            hint = f"did you mean {close[0]}?" if close else "no setting has this name (jaxmon serve --help lists them)"
        out.append((var, hint))
    return out
