"""JAX's private names that jaxmon relies on, each looked up here and nowhere else, each with a public fallback or a
clear degradation when a JAX release renames it: never a crash, never a silent change of behaviour.

- `jax._src.xla_bridge.backends()`: every backend that starts, beside the default one. Without it, the public
  fallback: `jax.local_devices(backend=...)` for each known platform.
- `jax._src.xla_bridge._backend_errors`: why a backend did not start (metrics.BACKEND_UP 0, the log says why).
  Without it, a backend that fails quietly is not reported.
- `jax.Array._committed`: lowering a tracked function again as its call compiled it (a cache hit). Without it, no
  cost analysis for the program (counted: metrics.TRAINING_TRACKING_PROBLEMS, `reason="cost"`): lowering
  without the committedness would be a real compile on the training thread.
- `Sharding._device_assignment`: a program's device order without a named mesh. Without it, the public fallback:
  the executable's `local_devices()`.
- `jax._src.xla_bridge._backends`: the backends started so far, read (without JAX's lock) in a forked child and
  when a tracker starts: JAX cannot run in a child whose backends a parent started before os.fork(). Without it,
  such a child is not told apart (its training tracker's start waits for ever on a compilation).
- `jax._src.profiler._profile_state` and `jax._src.lib._profiler`: jaxmon's own trace sessions, which give way to
  the user's. Without them, no sampled traces (each attempt counted: metrics.TRAINING_PROFILES,
  `result="failed"`).

Each missing name is logged once per process (a warning naming it and what jaxmon does instead) and counted in
`missing()`. The names are module constants so that a test can hide one (tests/unit/sources/test_private_jax.py)
without touching JAX.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from typing import Any

import structlog

log = structlog.get_logger("jaxmon.sources.local.private")

XLA_BRIDGE = "jax._src.xla_bridge"
BACKENDS = "backends"
BACKEND_ERRORS = "_backend_errors"
BACKEND_CACHE = "_backends"
COMMITTED = "_committed"
DEVICE_ASSIGNMENT = "_device_assignment"
PROFILER = "jax._src.profiler"
PROFILE_STATE = "_profile_state"
PROFILER_LIB = "jax._src.lib"
PROFILER_EXT = "_profiler"
# The platforms the public fallback asks JAX for, one by one, when xla_bridge.backends() is gone.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")

_lock = threading.Lock()
_missing: dict[str, int] = {}
_ABSENT: Any = object()
_forked = False  # this process is a forked child (of a parent that had imported this module)
_inherited: list[Any] = []  # the JAX backends (clients) it inherited at the fork


class PrivateApiMissing(RuntimeError):
    """A private JAX name jaxmon needs is gone (a JAX newer than the ones jaxmon was tested with)."""


def note_missing(name: str, instead: str) -> None:
    """Count that `name` was not found; the first time, say so and what jaxmon does `instead`."""
    with _lock:
        first = name not in _missing
        _missing[name] = _missing.get(name, 0) + 1
    if first:
        log.warning("a private JAX name jaxmon relies on is missing", name=name, instead=instead)


def missing() -> dict[str, int]:
    """How many times each missing private name was looked for, by name (empty with a JAX that has them all)."""
    with _lock:
        return dict(_missing)


def _module(name: str) -> Any | None:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class _Devices:
    """A backend as the public fallback knows it: its local devices."""

    def __init__(self, devices: list[Any]) -> None:
        self._devices = devices

    def local_devices(self) -> list[Any]:
        return self._devices


def backends(jax: Any, requested: Iterable[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Every backend JAX can start, by platform (each with `local_devices()`), and the error of each that could not.

    `xla_bridge.backends()` where it exists (a RuntimeError from it is the caller's: a plugin that fails loudly);
    else the public `jax.local_devices(backend=...)` for each known platform, whose failures are reported for the
    `requested` platforms only (JAX_PLATFORMS: the others are not installed, as far as the fallback can tell)."""
    bridge = _module(XLA_BRIDGE)
    listed = getattr(bridge, BACKENDS, None) if bridge is not None else None
    if callable(listed):
        return dict(listed()), backend_errors(bridge)
    note_missing(f"{XLA_BRIDGE}.{BACKENDS}", "backends listed one platform at a time with jax.local_devices()")
    wanted = set(requested)
    found: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for platform in PLATFORMS:
        try:
            devices = list(jax.local_devices(backend=platform))
        except Exception as exc:
            if platform in wanted:
                errors[platform] = str(exc)
            continue
        if devices:
            found.setdefault(str(devices[0].platform), _Devices(devices))
    return found, errors


def backend_errors(bridge: Any = None) -> dict[str, str]:
    """Why each backend that did not start failed (`xla_bridge._backend_errors`; `bridge`: the module, else it is
    imported); {} where the name is gone."""
    bridge = _module(XLA_BRIDGE) if bridge is None else bridge
    errors = getattr(bridge, BACKEND_ERRORS, _ABSENT)
    if errors is _ABSENT:
        note_missing(f"{XLA_BRIDGE}.{BACKEND_ERRORS}", "a backend that fails quietly is not reported")
        return {}
    return dict(errors)


def committed(x: Any, array_type: type) -> bool | None:
    """Whether `x` is committed to its devices (`jax.Array._committed`: jax has no public name for it). False for
    what is no `array_type` (a NumPy array, a scalar); None for an array without the name (counted, logged once)."""
    value = getattr(x, COMMITTED, _ABSENT)
    if value is not _ABSENT:
        return bool(value)
    if isinstance(x, array_type):
        note_missing(f"jax.Array.{COMMITTED}", "tracked functions get no cost analysis")
        return None
    return False


def device_assignment(sharding: Any, sharding_type: type) -> Any | None:
    """A sharding's devices in its program's order (`Sharding._device_assignment`); None where it has none, or where
    a `sharding_type` lacks the name (counted, logged once: the caller falls back to the executable's devices)."""
    devices = getattr(sharding, DEVICE_ASSIGNMENT, _ABSENT)
    if devices is not _ABSENT:
        return devices
    if isinstance(sharding, sharding_type):
        note_missing(f"Sharding.{DEVICE_ASSIGNMENT}", "the program's devices from the executable's local_devices()")
    return None


def profiler_internals() -> tuple[Any, Any, Any]:
    """jax.profiler's state, and XLA's ProfileOptions and ProfilerSession; raises PrivateApiMissing (counted,
    logged once) where one is gone: jaxmon then takes no trace, each attempt a failed sample."""
    profiler, lib = _module(PROFILER), _module(PROFILER_LIB)
    state = getattr(profiler, PROFILE_STATE, None)
    ext = getattr(lib, PROFILER_EXT, None)
    options, session = getattr(ext, "ProfileOptions", None), getattr(ext, "ProfilerSession", None)
    if state is None or not hasattr(state, "lock") or options is None or session is None:
        lockless = state is None or not hasattr(state, "lock")
        name = f"{PROFILER}.{PROFILE_STATE}" if lockless else f"{PROFILER_LIB}.{PROFILER_EXT}"
        note_missing(name, "no sampled traces")
        raise PrivateApiMissing(f"{name} is missing in this JAX: jaxmon takes no traces")
    return state, options, session


def forked_backends() -> bool:
    """Whether a backend JAX holds in this process was started by a parent before os.fork(): JAX cannot run here
    (its runtime's threads did not survive the fork: a compilation or a dispatch waits for ever) until the backends
    are cleared. False in a child whose parent had not imported jaxmon's JAX side, or where the name is gone."""
    if not _forked:
        return False
    cache = getattr(sys.modules.get(XLA_BRIDGE), BACKEND_CACHE, _ABSENT)
    if not isinstance(cache, dict):
        note_missing(f"{XLA_BRIDGE}.{BACKEND_CACHE}", "a forked child's training tracker may wait for ever to start")
        return False
    return any(client is old for client in cache.values() for old in _inherited)


def _after_fork_in_child() -> None:
    global _lock, _forked
    _lock = threading.Lock()  # it may have been held by another thread at fork
    _forked = True
    cache = getattr(sys.modules.get(XLA_BRIDGE), BACKEND_CACHE, None)  # not imported: no backend to inherit
    _inherited[:] = list(cache.values()) if isinstance(cache, dict) else []


os.register_at_fork(after_in_child=_after_fork_in_child)
