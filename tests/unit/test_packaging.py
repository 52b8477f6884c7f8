"""The installed distribution's metadata."""

from __future__ import annotations

from importlib.metadata import metadata


def test_the_license_is_an_spdx_expression() -> None:
    """`license = "Apache-2.0"` (PEP 639) installs as License-Expression; the deprecated TOML table does not."""
    meta = metadata("jaxmon")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "License" not in meta
