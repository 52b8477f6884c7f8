"""Installed versions, read from package metadata (no JAX import needed)."""

from __future__ import annotations

import platform
from importlib import metadata


def package_version(dist: str) -> str:
    """The installed version of `dist`, or "unknown"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info() -> dict[str, str]:
    """Versions for metrics.BUILD_INFO."""
    return {
        "version": package_version("jaxmon"),
        "jax_version": package_version("jax"),
        "jaxlib_version": package_version("jaxlib"),
        "python_version": platform.python_version(),
    }
