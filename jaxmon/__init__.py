"""jaxmon: a Prometheus exporter for JAX accelerators.

In a training script, `jaxmon.start(port)` serves the trainer's own devices in-process, and
`jaxmon.publish(directory)` hands snapshots to a `jaxmon serve --spool.dir` sidecar.
"""

from importlib import metadata

from jaxmon.embedded import Exporter, start
from jaxmon.publisher import Publisher, publish
from jaxmon.settings import SettingsError

try:
    __version__ = metadata.version("jaxmon")
except metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["Exporter", "Publisher", "SettingsError", "__version__", "publish", "start"]
