"""The installed distribution's metadata."""

from __future__ import annotations

import re
from importlib.metadata import metadata

import pytest

from tests.conftest import ROOT
from tests.floors import E2E_ONLY, floors, normalize, runtime_requirements, split, suite_requirements


def test_the_license_is_an_spdx_expression() -> None:
    """`license = "Apache-2.0"` (PEP 639) installs as License-Expression; the deprecated TOML table does not."""
    meta = metadata("jaxmon")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "License" not in meta


def test_every_runtime_dependency_has_a_floor_that_floors_sh_pins() -> None:
    """tests/floors.sh installs each runtime dependency at its `>=` floor: one with none (a bare `numpy`) would go
    untested, so reading the floors refuses it; every requirement of `dependencies` and the runtime extras is
    pinned."""
    pinned = floors()
    assert {split(r)[0] for r in runtime_requirements()} == set(pinned)
    assert pinned["prometheus-client"] and pinned["jax"] == pinned["jaxlib"]
    with pytest.raises(ValueError, match="'numpy' has no `>=` floor"):
        floors(["numpy"])


def test_the_floors_venv_leaves_out_only_what_the_unit_suite_never_imports() -> None:
    """The floors venv installs the test extra less E2E_ONLY (libraries needing a newer JAX than the floor): no
    unit test may import one of them, or the floors run would fail for want of it rather than of a floor."""
    modules = {"orbax", "grain", "keras", "flax", "optax"}
    assert {normalize(n) for n in E2E_ONLY} == {"orbax-checkpoint", "grain", "keras", "flax", "optax"}
    pattern = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(modules) + r")\b", re.M)
    importing = [str(p) for p in (ROOT / "tests" / "unit").rglob("*.py") if pattern.search(p.read_text())]
    assert importing == []
    assert {split(r)[0] for r in suite_requirements()}.isdisjoint(E2E_ONLY | {"jaxmon"})
