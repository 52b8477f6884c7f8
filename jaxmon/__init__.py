"""jaxmon: a Prometheus exporter for JAX accelerators.

In a training script, `jaxmon.start(port)` serves the trainer's own devices in-process (`jaxmon.stop()` ends it), and
`jaxmon.publish(directory)` hands snapshots to a `jaxmon serve --collector.spool.dir` sidecar. With either running,
`jaxmon.step(n, loss)` each step (and optionally `jaxmon.track(jitted_fn)` and `with jaxmon.badput(kind):`) adds
step time, throughput, MFU and goodput.

The names are imported on first use (PEP 562): the daemon (`jaxmon serve`, which imports this package before
jaxmon.cli) never loads the embedded exporter, the publisher or the training tracker, which only a training script
uses. The first use of any name imports the three modules that define them (what `import jaxmon` did before),
binds every name here, then removes the module's `__getattr__`, so `jaxmon.step` is again a plain module
attribute: CPython does not specialize attribute reads of a module that has a `__getattr__` (about 10 ns more per
`jaxmon.step` read).
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxmon.checkpoints import checkpointed
    from jaxmon.embedded import Exporter, start, stop
    from jaxmon.publisher import Publisher, publish
    from jaxmon.settings import SettingsError
    from jaxmon.training import Tracked, badput, step, track

try:
    __version__ = metadata.version("jaxmon")
except metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

# Each public name and the module that defines it.
_LAZY = {
    "Exporter": "jaxmon.embedded",
    "start": "jaxmon.embedded",
    "stop": "jaxmon.embedded",
    "Publisher": "jaxmon.publisher",
    "publish": "jaxmon.publisher",
    "SettingsError": "jaxmon.settings",
    "checkpointed": "jaxmon.checkpoints",
    "Tracked": "jaxmon.training",
    "badput": "jaxmon.training",
    "step": "jaxmon.training",
    "track": "jaxmon.training",
}

__all__ = [
    "Exporter",
    "Publisher",
    "SettingsError",
    "Tracked",
    "__version__",
    "badput",
    "checkpointed",
    "publish",
    "start",
    "step",
    "stop",
    "track",
]


def __getattr__(name: str) -> object:
    """A public name's first use: import the modules that define them all, bind every name, drop this hook."""
    if name not in _LAZY:
        raise AttributeError(f"module 'jaxmon' has no attribute {name!r}")
    namespace = globals()
    for public, module in _LAZY.items():
        namespace[public] = getattr(importlib.import_module(module), public)
    namespace.pop("__getattr__", None)  # another thread may have come first
    return namespace[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
