"""`--help` in the words a user types: an example value (`--collector.probe.interval 15s`, `--web.max-requests 40`),
PATH and NAMES (default: a,b) instead of pydantic-settings' type names, and the sections that act only inside the
workload process marked so.

pydantic-settings builds each flag's metavar from the field's Python type (`str`, `float`, `{Path,None}`) and
prints the default as Python prints it (`15.0`). Its `add_argument_method` hook sees every flag before argparse
does, and its `add_argument_group_method` every section; these rewrite what the user reads there, and nothing that
is parsed. A flag's example is its default as the user would write it, else `EXAMPLES`' (tests/unit/test_cli.py
passes every example back to the parser).
"""

from __future__ import annotations

import argparse
import ast
import re
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from jaxmon.settings.durations import format_duration, parse_duration

AddArgument = Callable[..., Any]
AddGroup = Callable[..., Any]
_DEFAULT = re.compile(r"\(default: ([^)]*)\)")

# The example a flag without a default shows in place of its type.
EXAMPLES = {
    "--collector.training.peak-flops": "989e12",
    "--collector.nvml.timeout": "2s",
    "--collector.spool.remove-after": "5m",
    "--health.max-staleness": "15s",
    "--collector.kubernetes.node-name": "NAME",
}
# A flag of a new kind without a default or an entry above: an example of its kind.
_GENERIC = {"DURATION": "30s", "int": "8", "float": "0.5", "str": "TEXT"}

# The sections that act only inside the workload process (jaxmon.start(), jaxmon.publish()): a daemon accepts them
# and they change nothing there (tests/unit/test_cli.py holds this to each collector's `unavailable`).
WORKLOAD_ONLY = ("collector.compile", "collector.training", "collector.checkpoint", "collector.default-registry")
WORKLOAD_ONLY_NOTE = (
    "Workload only: these act inside the training process, set by jaxmon.start(collector={'NAME': {...}}) or "
    "jaxmon.publish(...) there, or by its JAXMON_COLLECTOR__UPPER__* variables or YAML file. jaxmon serve "
    "accepts them, and they change nothing there."
)
WORKLOAD_NESTED_NOTE = (
    "Workload only, as SECTION's: these act inside the training process (jaxmon.start(), jaxmon.publish()), never "
    "on the daemon's own devices."
)


def _is_duration(info: FieldInfo) -> bool:
    def has(metadata: Sequence[Any]) -> bool:
        return any(getattr(m, "func", None) is parse_duration for m in metadata)

    # `Duration` keeps its validator in the field's metadata; `Duration | None` inside the union's Annotated arm.
    return has(info.metadata) or any(has(getattr(arm, "__metadata__", ())) for arm in get_args(info.annotation))


def _is_path(info: FieldInfo) -> bool:
    return info.annotation is Path or Path in get_args(info.annotation)


def _is_enabled(info: FieldInfo) -> bool:
    args = get_args(info.annotation)
    return bool in args and any("auto" in get_args(a) for a in args)


def _is_names(info: FieldInfo) -> bool:
    """A tuple of strings, given comma-separated (`--collector.kubernetes.gpu-resources a,b`)."""
    return get_args(info.annotation) == (str, ...)


def _optional_number(info: FieldInfo) -> str | None:
    """float or int for `float | None` and `int | None` (pydantic-settings would print `{float,None}`)."""
    args = set(get_args(info.annotation))
    if type(None) not in args or len(args) != 2:
        return None
    (kind,) = args - {type(None)}
    return {float: "float", int: "int"}.get(kind)


def flag_kinds(model: type[BaseModel], prefix: str = "--") -> Iterator[tuple[str, str]]:
    """(flag, kind) for every duration, path, true/false/auto and optional number flag of `model`, nested sections
    included."""
    for name, info in model.model_fields.items():
        flag = prefix + name.replace("_", "-")
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from flag_kinds(annotation, flag + ".")
        elif _is_duration(info):
            yield flag, "DURATION"
        elif _is_path(info):
            yield flag, "PATH"
        elif _is_enabled(info):
            yield flag, "{true,false,auto}"
        elif _is_names(info):
            yield flag, "NAMES"
        elif (number := _optional_number(info)) is not None:
            yield flag, number


def _default_shown(kind: str, text: str) -> str | None:
    """The default as the user would write it; None to leave it out (no default: the description says why)."""
    if text == "None":
        return None
    if kind == "DURATION":
        return format_duration(float(text))
    if kind == "{true,false,auto}":
        return text.lower()
    return text


def _example(flag: str, metavar: str, help_text: object) -> str:
    """What a valued flag shows in place of its type: `EXAMPLES`' entry, else its default, else its kind's."""
    if flag in EXAMPLES:
        return EXAMPLES[flag]
    match = _DEFAULT.search(help_text) if isinstance(help_text, str) else None
    if match and match.group(1) != "None":
        return match.group(1)
    return _GENERIC.get(metavar, metavar)


def _workload_section(section: str) -> str | None:
    """The `WORKLOAD_ONLY` section that `section` is or is inside (`collector.training.profile`), else None."""
    return next((s for s in WORKLOAD_ONLY if section == s or section.startswith(s + ".")), None)


def group_hook(add_group: AddGroup) -> AddGroup:
    """An `add_argument_group_method` for CliSettingsSource: the `WORKLOAD_ONLY` sections' titles say so, and so do
    the titles of the sections nested in them."""

    def add_argument_group(parser: Any, **kwargs: Any) -> Any:
        title = kwargs.get("title")
        section = title.removesuffix(" options") if isinstance(title, str) else ""
        outer = _workload_section(section)
        if outer is not None:
            kwargs["title"] = f"{section} options (workload only)"
            if section == outer:
                name = section.removeprefix("collector.").replace("-", "_")
                note = WORKLOAD_ONLY_NOTE.replace("NAME", name).replace("UPPER", name.upper())
            else:
                note = WORKLOAD_NESTED_NOTE.replace("SECTION", outer)
            kwargs["description"] = textwrap.fill(note, 76)  # argparse indents it by 2
        return add_group(parser, **kwargs)

    return add_argument_group


def help_hook(
    model: type[BaseModel],
    hidden: Callable[[str], bool] = lambda flag: False,
    extra: Sequence[tuple[str, str]] = (),
) -> AddArgument:
    """An `add_argument_method` for CliSettingsSource: user words for metavars and defaults, `hidden` flags out
    of the help, and `extra` (flag, help) store-true flags listed after --help (parsed by the caller)."""
    kinds = dict(flag_kinds(model))

    def add_argument(parser: Any, *names: str, **kwargs: Any) -> Any:
        flag = names[0] if names else ""
        kind = kinds.get(flag)
        if kind is not None:
            kwargs["metavar"] = kind
            help_text = kwargs.get("help")
            if isinstance(help_text, str) and kind == "NAMES" and "(default: " in help_text:
                # A tuple's repr holds parentheses the pattern below stops at: it ends the help text.
                head, _, default = help_text.rpartition("(default: ")
                values = ast.literal_eval(default.strip().removesuffix(")"))
                kwargs["help"] = f"{head}(default: {','.join(values)})"
            elif isinstance(help_text, str):
                match = _DEFAULT.search(help_text)
                if match:
                    shown = _default_shown(kind, match.group(1))
                    replacement = "" if shown is None else f"(default: {shown})"
                    help_text = (help_text[: match.start()] + replacement + help_text[match.end() :]).rstrip()
                kwargs["help"] = help_text
        if kwargs.get("metavar") in _GENERIC:  # a duration, a number or text: an example of it
            kwargs["metavar"] = _example(flag, kwargs["metavar"], kwargs.get("help"))
        if flag and hidden(flag):
            kwargs["help"] = argparse.SUPPRESS
        action = parser.add_argument(*names, **kwargs)
        if "--help" in names:
            for extra_flag, extra_help in extra:
                parser.add_argument(extra_flag, action="store_true", default=argparse.SUPPRESS, help=extra_help)
        return action

    return add_argument
