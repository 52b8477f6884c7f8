"""jaxmon's own profiler sessions beside the user's `jax.profiler` ones: the user always wins.

XLA's profiler runs one session per process (tsl's ProfilerLock). A second session is made without error but
holds nothing, and fails at its stop ("ALREADY_EXISTS: Another profiling session active"): a user whose
`jax.profiler.start_trace()` ran while jaxmon traced would lose their profile. jax 0.10.2 offers no hook for "someone
wants to profile" (jax._src.profiler: `start_trace` takes `_profile_state.lock`, raises when
`_profile_state.profile_session` is set, then makes a session), so jaxmon:

- makes its sessions itself (`_profiler.ProfilerSession`), outside `_profile_state`: jax.profiler never sees a
  jaxmon trace as "already started";
- before it starts one, reads `_profile_state.profile_session` under `_profile_state.lock`: the user's session
  (start_trace, `jax.profiler.trace()`) means `Busy`, and jaxmon makes no session (an attempt would touch nothing:
  the check comes first);
- wraps `_profile_state.lock` (the one piece of jax.profiler's state it changes, once per process): every
  `start_trace`, `stop_trace` and `stop_and_get_fdo_profile` of the user's enters it first, and the wrapper ends
  jaxmon's running session (dropping it: 0.2 ms, no export) before the user's call goes on, so that call makes the
  process's only session. jaxmon counts that sample `busy`.

Limits, said in docs/training.md: a user's `start_trace` that comes while jaxmon's session is being stopped waits
for that stop (milliseconds on CPU; up to the stop of a large trace, 0.5 s seen on 8 devices); a remote capture
through `jax.profiler.start_server()` (TensorBoard's "capture profile") does not pass through jax.profiler's
state: during jaxmon's sample it fails as a second session, and during the user's capture jaxmon's session is
the one that fails (counted `busy`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jaxmon.sources.local.private as private
from jaxmon.sampled_traces import Busy

# What XLA says when a session could not take the profiler (another one holds it).
_OTHER_SESSION = "Another profiling session active"


class _Guard:
    """`_profile_state.lock` of jax.profiler, wrapped: entering it ends jaxmon's session first (jaxmon itself never
    enters it: it takes the wrapped lock directly). Otherwise the lock it wraps, unchanged."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._own = threading.Lock()  # jaxmon's session's lock; taken before the wrapped one, never after it
        self.session: Any = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._own:
            if self.session is not None:
                session, self.session = self.session, None
                del session  # its destructor stops it and frees the profiler, without collecting anything
            return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return bool(self._lock.locked())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lock, name)


_install_lock = threading.Lock()


def _guard(state: Any) -> _Guard:
    """jax.profiler's lock, wrapped once per process."""
    with _install_lock:
        lock = state.lock
        if not isinstance(lock, _Guard):
            lock = state.lock = _Guard(lock)
        return lock


class JaxProfiler:
    """Start and stop jaxmon's traces; `Busy` whenever the user's profiling is in the way."""

    def __init__(self, jax: Any) -> None:
        # jax.profiler's state and XLA's session types (private names: jaxmon.sources.local.private), looked up at
        # the first trace; where one is gone every trace fails (a failed sample), the user's profiling untouched.
        self._internals: tuple[Any, Any, Any] | None = None
        self._guard_: _Guard | None = None  # wrapped at the first trace: with sampling off, nothing is touched
        # A trace names a device by its local ordinal: its place among this process's devices.
        self._devices = {(str(d.platform), i): (str(d.platform), int(d.id)) for i, d in enumerate(jax.local_devices())}

    @property
    def _state(self) -> Any:
        if self._internals is None:
            self._internals = private.profiler_internals()  # raises PrivateApiMissing where a name is gone
        return self._internals[0]

    @property
    def _guard(self) -> _Guard:
        if self._guard_ is None:
            self._guard_ = _guard(self._state)
        return self._guard_

    def devices(self) -> Mapping[tuple[str, int], tuple[str, int]]:
        """A trace's device ((platform, local ordinal)) as the device the training families name."""
        return self._devices

    def start(self, python: bool) -> None:
        """Start jaxmon's session (raises Busy while the user's runs). `python`: trace Python calls too (a trace on
        demand, as jax.profiler does); a sample traces the devices and XLA's host events only."""
        guard = self._guard
        with guard._own:
            if not guard._lock.acquire(timeout=1.0):
                raise Busy("jax.profiler's lock is held: the user is starting or stopping a trace")
            try:
                if self._state.profile_session is not None:
                    raise Busy("the user is profiling (jax.profiler.start_trace / jax.profiler.trace)")
                if guard.session is not None:
                    raise Busy("jaxmon's own trace runs")
                _, options_type, session_type = self._internals or private.profiler_internals()
                options = options_type()
                options.python_tracer_level = 1 if python else 0
                options.host_tracer_level = 2
                guard.session = session_type(options)
            finally:
                guard._lock.release()

    def _take(self) -> Any:
        guard = self._guard
        session, guard.session = guard.session, None
        if session is None:
            raise Busy("the user started a trace: jaxmon ended its own")
        return session

    def stop(self) -> bytes:
        """End jaxmon's session: the serialized XSpace (Busy when the user's trace ended it, or held the profiler)."""
        with self._guard._own:
            session = self._take()
            try:
                return bytes(session.stop())
            except Exception as exc:
                if _OTHER_SESSION in str(exc):
                    raise Busy(f"another profiler session held the profiler: {exc}") from None
                raise

    def export(self, directory: Path) -> None:
        """End jaxmon's session, writing the profile directory XProf reads (plugins/profile/<run>/...)."""
        with self._guard._own:
            session = self._take()
            try:
                session.stop_and_export(str(directory))
            except Exception as exc:
                if _OTHER_SESSION in str(exc):
                    raise Busy(f"another profiler session held the profiler: {exc}") from None
                raise
