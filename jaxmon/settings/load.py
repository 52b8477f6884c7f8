"""Loading the settings: flags, then `JAXMON_*` variables, then the YAML file, then defaults (start() arguments take
the place of flags).

Every source is read here, old names mapped (`aliases`), and every setting's origin recorded, so an error names
the setting as the user wrote it: `--probe.timeout`, `JAXMON_PROBE__INTERVL`, `probe.intervall (config file
c.yml)`. A flag, variable (inside a section) or key that names no setting is an error with what was probably
meant; argparse only ever sees flags that exist, so it never prints its usage dump for a typo.
"""

from __future__ import annotations

import json
import os
import re
from argparse import ArgumentParser
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import CliSettingsSource

import jaxmon.settings.aliases as aliases
from jaxmon.settings.errors import Origin, Origins, config_problems, describe, environment_names, suggestion
from jaxmon.settings.fields import ENV_PREFIX, Path_, dotted, flag, is_switch, leaves, lookup, path_of_flag, variable
from jaxmon.settings.help import group_hook, help_hook
from jaxmon.settings.schema import Settings, SettingsError

S = TypeVar("S", bound=Settings)

_SHORTHAND = re.compile(r"^--(no-)?collector\.([a-z0-9_]+)$")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
HELP = ("-h", "--help")


@dataclass
class _Read:
    """What one source gave: nested values, where each came from, what is wrong, and remarks for the log."""

    data: dict[str, Any] = field(default_factory=dict)
    origins: Origins = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _set(data: dict[str, Any], path: Path_, value: Any) -> None:
    """Put `value` at `path`, merging into a mapping already there."""
    for name in path[:-1]:
        inner = data.get(name)
        if not isinstance(inner, dict):
            inner = data[name] = {}
        data = inner
    if isinstance(value, dict) and isinstance(data.get(path[-1]), dict):
        data[path[-1]] = _merged(data[path[-1]], value)
    else:
        data[path[-1]] = value


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


# -- flags ------------------------------------------------------------------------------------------------------


def _flags(model: type[BaseModel], argv: Sequence[str], passthrough: Sequence[str]) -> tuple[list[str], _Read]:
    """argv as pydantic-settings will parse it (current names, `--flag=value`), and what the flags gave."""
    switches = {path for path, info in leaves(model) if is_switch(info)}
    valued = {path for path, info in leaves(model) if not is_switch(info)}
    collectors = set(model.model_fields["collector"].annotation.model_fields)  # type: ignore[union-attr]
    spellings = [flag(p) for p in valued | switches] + ["--no-" + flag(p)[2:] for p in switches]
    spellings += [flag(old) for p in valued | switches if (old := aliases.old_path(p)) is not None]
    spellings += [f"--collector.{c}" for c in collectors] + [f"--no-collector.{c}" for c in collectors]
    out: list[str] = []
    read = _Read()
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token in HELP or token in passthrough:
            out.append(token)
            continue
        if not token.startswith("-"):
            read.problems.append(f"unexpected argument {token!r}: settings are flags (--help lists them)")
            continue
        name, eq, value = token.partition("=")
        negated = name.startswith("--no-")
        shorthand = _SHORTHAND.match(name)
        if shorthand is not None and shorthand.group(2) in collectors:
            # node_exporter's --collector.X / --no-collector.X / --collector.X=auto set collector.X.enabled.
            if negated and eq:
                read.problems.append(f"{token}: write --no-collector.{shorthand.group(2)} or --collector.X=VALUE")
                continue
            path: Path_ = ("collector", shorthand.group(2), "enabled")
            value = value if eq else ("false" if negated else "true")
            out.append(f"{flag(path)}={value}")
            read.origins[path] = Origin("flag", name)
            continue
        written = path_of_flag("--" + name[len("--no-") :] if negated else name)
        path = aliases.current_path(written)
        if path in switches:
            if eq and (negated or value.lower() not in (*_TRUE, *_FALSE)):
                read.problems.append(f"{name}: takes no value, or true/false (got {value!r})")
                continue
            on = value.lower() in _TRUE if eq else not negated
            out.append(flag(path) if on else "--no-" + flag(path)[2:])
        elif path in valued and not negated:
            if not eq:
                if i >= len(argv) or argv[i].startswith("--"):
                    read.problems.append(f"{name}: needs a value")
                    continue
                value = argv[i]  # may start with "-": `--poll.interval -1s` is a (bad) value, not a flag
                i += 1
            out.append(f"{flag(path)}={value}")
            _set(read.data, path, value)
        else:
            read.problems.append(f"{name}: no such flag{suggestion(name, spellings)}")
            if not eq and i < len(argv) and not argv[i].startswith("-"):
                i += 1  # its value, most likely: not a second problem
            continue
        read.origins[path] = Origin("flag", name)
        if path != written and written[0] in aliases.OLD:
            read.notes.append(f"{name} is the old name of {flag(path)} (both work)")
    return out, read


# -- environment --------------------------------------------------------------------------------------------------


def _json_or_text(value: str) -> Any:
    """A whole section given as one variable is JSON (`JAXMON_WEB='{"listen_address": ":1"}'`); `false` is too."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _environment(model: type[BaseModel], environ: Mapping[str, str]) -> _Read:
    """The JAXMON_* variables inside a section; one naming no setting there is an error. Others are left to
    `unused_environment` (a warning: other tools share the prefix)."""
    tops = set(model.model_fields) | set(aliases.SECTIONS)
    read = _Read()
    found: list[tuple[bool, str, Path_, Path_]] = []
    for var in environ:
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        written = tuple(part.lower() for part in upper[len(ENV_PREFIX) :].split("__"))
        if written[0] not in tops:
            continue  # not a setting at all: unused_environment warns about it
        path = aliases.current_path(written)
        found.append((path == written, var, written, path))
    names = environment_names(model)
    for _current, var, written, path in sorted(found):  # old names first: the current name wins
        target = lookup(model, path) if all(written) else None
        if target is None:
            read.problems.append(f"{var}: no such setting{suggestion(var.upper(), names)}")
            continue
        value: Any = environ[var]
        if isinstance(target, type) or get_origin(target.annotation) is list:  # a section, or a list
            value = _json_or_text(value)
        _set(read.data, path, value)
        read.origins[path] = Origin("environment", var)
        if path != written and written[0] in aliases.OLD:
            read.notes.append(f"{var} is the old name of {variable(path)} (both work)")
    return read


# -- nested mappings: the YAML file and start() arguments -----------------------------------------------------------


def _nested(
    model: type[BaseModel], given: Mapping[str, Any], source: str, spell: Callable[[Path_], str], where: str
) -> _Read:
    """A nested mapping of settings (old section names mapped, the current ones winning) and its origins."""
    read = _Read(problems=config_problems(given, model, where))
    if read.problems:
        return read
    ordered = sorted(given.items(), key=lambda item: aliases.current_path((str(item[0]),)) == (str(item[0]),))
    for key, value in ordered:
        written = (str(key),)
        path = aliases.current_path(written)
        _set(read.data, path, value)
        _record(model, value, written, path, source, spell, read.origins)
        if path != written and written[0] in aliases.OLD:
            read.notes.append(f"{spell(written)}: {dotted(written)} is the old name of {dotted(path)} (both work)")
    return read


def _record(
    model: type[BaseModel], value: Any, written: Path_, path: Path_, source: Any, spell: Callable[[Path_], str],
    origins: Origins,
) -> None:  # fmt: skip
    target = lookup(model, path)
    if isinstance(target, type) and isinstance(value, Mapping):
        for key, inner in value.items():
            _record(model, inner, (*written, str(key)), (*path, str(key)), source, spell, origins)
    else:
        origins[path] = Origin(source, spell(written))


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml  # only with a config file: PyYAML is about 1 MiB of RSS a daemon without one does not need

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


# -- all together -------------------------------------------------------------------------------------------------


def load_settings(
    model: type[S],
    argv: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
    arguments: Mapping[str, Any] | None = None,
    prog: str = "jaxmon serve",
    title: str = "invalid settings",
    help_extra: Sequence[tuple[str, str]] = (),
    help_hidden: Callable[[str], bool] = lambda flag: False,
    help_epilog: Callable[[], str] | None = None,
) -> S:
    """Settings of `model` from flags (`argv`) or start() `arguments`, the environment and the YAML file.

    Raises SettingsError with one line per problem. `--help` prints the help (and `help_epilog()`) and exits, as
    argparse does; `help_extra` (flag, help) are the command's own switches, listed there and passed through
    (the caller parses them); `help_hidden` flags are accepted but left out of the help.
    """
    env = os.environ if environ is None else environ
    argv_out, flags = _flags(model, argv, [f for f, _ in help_extra])
    if any(a in HELP for a in argv):
        _parse_cli(model, argv_out, prog, help_extra, help_hidden, help_epilog)
    environment = _environment(model, env)
    args = _nested(model, arguments or {}, "argument", dotted, "") if arguments else _Read()
    config_path = _config_file(environment, flags, args)
    file = _Read()
    if config_path is not None:
        where = f" (config file {config_path})"
        file = _nested(model, _read_yaml(config_path), "file", lambda p: dotted(p) + where, where)
    problems = flags.problems + environment.problems + file.problems + args.problems
    if problems:
        raise SettingsError(f"{title}:\n  " + "\n  ".join(problems))
    cli = _parse_cli(model, argv_out, prog, help_extra, help_hidden, help_epilog) if argv_out else {}
    merged = _merged(_merged(_merged(file.data, environment.data), cli), args.data)
    origins = {**file.origins, **environment.origins, **flags.origins, **args.origins}
    try:
        settings = model.model_validate(merged)
    except ValidationError as exc:
        raise SettingsError(describe(exc, origins, title)) from exc
    settings.notes.extend(file.notes + environment.notes + flags.notes + args.notes)
    return settings


def _config_file(*reads: _Read) -> Path | None:
    path: Path | None = None
    for read in reads:  # lowest precedence first
        value = read.data.get("config", {}).get("file") if isinstance(read.data.get("config"), dict) else None
        if value:
            path = Path(str(value))
    return path


def _parse_cli(
    model: type[Settings],
    argv: list[str],
    prog: str,
    help_extra: Sequence[tuple[str, str]],
    help_hidden: Callable[[str], bool],
    help_epilog: Callable[[], str] | None,
) -> dict[str, Any]:
    """What pydantic-settings' argparse makes of `argv` (only flags that exist, in `--flag=value` form)."""
    try:
        source: CliSettingsSource[Any] = CliSettingsSource(
            model,
            cli_prog_name=prog,
            cli_parse_args=[a for a in argv if a not in {f for f, _ in help_extra}],
            add_argument_method=help_hook(model, help_hidden, help_extra),
            add_argument_group_method=group_hook(ArgumentParser.add_argument_group),
        )
        return dict(source())
    except SystemExit:
        if help_epilog is not None and any(a in HELP for a in argv):
            print()  # argparse ends the last section without a blank line
            print(help_epilog())
        raise
