"""jaxmon: a Prometheus exporter for JAX accelerators."""

from importlib import metadata

try:
    __version__ = metadata.version("jaxmon")
except metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["__version__"]
