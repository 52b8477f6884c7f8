"""jaxmon: a Prometheus exporter for JAX accelerators.

In a training script, `jaxmon.start(port)` serves the trainer's own devices in-process (`jaxmon.stop()` ends it), and
`jaxmon.publish(directory)` hands snapshots to a `jaxmon serve --collector.spool.dir` sidecar. With either running,
`jaxmon.step(n, loss)` each step (and optionally `jaxmon.track(jitted_fn)` and `with jaxmon.badput(kind):`) adds
step time, throughput, MFU and goodput.

Each public name is re-exported from the module that defines it (`EXPORTS`; the imports under TYPE_CHECKING say the
same to type checkers), lazily: the first read of one imports those modules and binds every name here as a plain
module attribute, then the hook that did it goes. So the daemon (`jaxmon serve`, which imports this package before
jaxmon.cli) loads no embedded exporter, publisher or training tracker, which only a training script uses, and a
training script's `jaxmon.step` is a plain module attribute read: CPython does not specialize the read of a module
that defines __getattr__ (17-61 ns more a step: bench/module_attribute.py, BENCHMARKS.md).
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxmon.checkpoints import checkpointed as checkpointed
    from jaxmon.embedded import Exporter as Exporter
    from jaxmon.embedded import start as start
    from jaxmon.embedded import stop as stop
    from jaxmon.publisher import Publisher as Publisher
    from jaxmon.publisher import publish as publish
    from jaxmon.settings import SettingsError as SettingsError
    from jaxmon.training import Tracked as Tracked
    from jaxmon.training import badput as badput
    from jaxmon.training import step as step
    from jaxmon.training import track as track

try:
    __version__ = metadata.version("jaxmon")
except metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

# Each public name and the module it is re-exported from.
EXPORTS = {
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

__all__ = ["__version__", *sorted(EXPORTS)]


def __getattr__(name: str) -> object:
    """A public name's first read: bind every public name here, from its module, and drop this hook."""
    if name not in EXPORTS:
        raise AttributeError(f"module 'jaxmon' has no attribute {name!r}")
    namespace = globals()
    for public, module in EXPORTS.items():
        namespace[public] = getattr(importlib.import_module(module), public)
    namespace.pop("__getattr__", None)  # (another thread may have come first)
    return namespace[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS})
