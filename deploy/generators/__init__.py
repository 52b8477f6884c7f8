"""The generators of the deployment files that must agree with a single source (deploy/generate.py runs them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import dashboard, rules
from .paths import ROOT

Generator = Callable[[], dict[Path, str]]

# Each generator returns the files it owns and their content; a new kind of generated file is one more entry.
GENERATORS: list[Generator] = [rules.outputs, dashboard.outputs]


def outputs() -> dict[Path, str]:
    """Every generated file and its expected content, in the generators' order."""
    files: dict[Path, str] = {}
    for generator in GENERATORS:
        for path, text in generator().items():
            # Two generators writing one file would make the last one win silently.
            if path in files:
                raise ValueError(f"{path.relative_to(ROOT)} is generated twice")
            files[path] = text
    return files


__all__ = ["GENERATORS", "ROOT", "Generator", "outputs"]
