"""jaxmon: a Prometheus exporter for JAX accelerators.

In a training script, `jaxmon.start(port)` serves the trainer's own devices in-process, and
`jaxmon.publish(directory)` hands snapshots to a `jaxmon serve --collector.spool.dir` sidecar. With either running,
`jaxmon.step(n, loss)` each step (and optionally `jaxmon.track(jitted_fn)` and `with jaxmon.badput(kind):`) adds
step time, throughput, MFU and goodput.
"""

from importlib import metadata

from jaxmon.embedded import Exporter, start
from jaxmon.publisher import Publisher, publish
from jaxmon.settings import SettingsError
from jaxmon.training import Tracked, badput, step, track

try:
    __version__ = metadata.version("jaxmon")
except metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = [
    "Exporter",
    "Publisher",
    "SettingsError",
    "Tracked",
    "__version__",
    "badput",
    "publish",
    "start",
    "step",
    "track",
]
