"""The floors of jaxmon's runtime dependencies, read from pyproject.toml (the one place they are written), for
tests/floors.sh, which installs each at its floor and runs the unit suite.

Usage: floors.py constraints    pip constraints pinning each runtime dependency (`dependencies` and the runtime
                                extras) to its `>=` floor, one `name==floor` a line
       floors.py requirements   the test extra's requirements, unpinned, less what only the end-to-end tests import
       floors.py check          exit 1 unless every pinned distribution is installed at its floor (run with the
                                floors venv's Python: pip keeps a constraint, but a renamed or vendored distribution
                                would leave it unused)

Runs on the standard library alone (tomllib), before any venv exists.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# The extras a trainer or the daemon runs with (cuda and tpu repeat jax's floor and tpu-info's). `test` and `bench`
# are this repository's tools.
RUNTIME_EXTRAS = ("cuda", "tpu", "serve", "top")
# The test extra's training libraries: only tests/e2e imports them (tests/unit/test_packaging.py holds it), and each
# needs a newer JAX than jaxmon's floor, so the floors venv leaves them out rather than fail to resolve.
E2E_ONLY = frozenset({"orbax-checkpoint", "grain", "keras", "flax", "optax"})

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def normalize(name: str) -> str:
    """PEP 503's normalized name (`Prometheus_Client` and `prometheus-client` are one distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def split(requirement: str) -> tuple[str, str]:
    """A requirement's normalized name and its version specifiers (`"jax[tpu]>=0.6"` -> `("jax", ">=0.6")`)."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"pyproject.toml: cannot read the requirement {requirement!r}")
    return normalize(match.group(1)), match.group(3).replace(" ", "")


def project() -> dict[str, Any]:
    """pyproject.toml's [project] table."""
    with PYPROJECT.open("rb") as f:
        return dict(tomllib.load(f)["project"])


def runtime_requirements() -> list[str]:
    """`dependencies` and the runtime extras' requirements, in pyproject's order."""
    meta = project()
    extras: dict[str, list[str]] = meta["optional-dependencies"]
    deps: list[str] = meta["dependencies"]
    return deps + [r for extra in RUNTIME_EXTRAS for r in extras[extra]]


def floors(requirements: list[str] | None = None) -> dict[str, str]:
    """Each runtime dependency's floor (of `requirements`, by default pyproject's) by normalized name. A dependency
    with no `>=` floor is an error: its floor would be untested."""
    found: dict[str, str] = {}
    for requirement in runtime_requirements() if requirements is None else requirements:
        name, specifiers = split(requirement)
        floor = [s.removeprefix(">=") for s in specifiers.split(",") if s.startswith(">=")]
        if len(floor) != 1:
            raise ValueError(f"pyproject.toml: {requirement!r} has no `>=` floor (every runtime dependency needs one)")
        if found.setdefault(name, floor[0]) != floor[0]:
            raise ValueError(f"pyproject.toml: {name} has two floors, {found[name]} and {floor[0]}")
    return found


def suite_requirements() -> list[str]:
    """The test extra, less jaxmon itself (installed with its extras by floors.sh) and E2E_ONLY."""
    extras: dict[str, list[str]] = project()["optional-dependencies"]
    return [r for r in extras["test"] if split(r)[0] not in E2E_ONLY | {"jaxmon"}]


def same_release(a: str, b: str) -> bool:
    """`0.14` and `0.14.0` are one release (PEP 440 pads with zeros)."""
    return a.split(".") + ["0"] * (b.count(".") - a.count(".")) == b.split(".") + ["0"] * (a.count(".") - b.count("."))


def check() -> list[str]:
    """What is not installed at its floor, one line each."""
    wrong = []
    for name, floor in floors().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "not installed"
        if not same_release(installed, floor):
            wrong.append(f"{name}: {installed}, its floor is {floor}")
    return wrong


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) == 2 else ""
    if command == "constraints":
        print("\n".join(f"{name}=={floor}" for name, floor in floors().items()))
    elif command == "requirements":
        print("\n".join(suite_requirements()))
    elif command == "check":
        wrong = check()
        print("\n".join(wrong) if wrong else f"{len(floors())} runtime dependencies at their floors")
        return 1 if wrong else 0
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
