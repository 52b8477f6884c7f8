"""Fault injection for tests: a JSON file named by JAXMON_FAULTS_FILE makes polls or probes hang.

`FaultySource` wraps the real device source, so no production code carries hooks for it.

The file is re-read when it changes, so a test can start a hang and end it (recovery) while the daemon runs:
`{"poll_delay_seconds": 30, "probe_delay_seconds": {"cpu:3": 30}}`. Unset, it costs one dict lookup.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxmon.device_readings import BackendStatus, DeviceInfo, ProbeKernel
from jaxmon.sources import DeviceSource

ENV_VAR = "JAXMON_FAULTS_FILE"


class Faults:
    """Reads the fault file on demand; an absent or broken file means no faults."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._data: dict[str, Any] = {}

    @property
    def inactive(self) -> bool:
        """True when no fault file is configured."""
        return self._path is None

    @classmethod
    def from_env(cls) -> Faults:
        """The hook the daemon uses: only active when the variable is set."""
        return cls(os.environ.get(ENV_VAR) or None)

    def _current(self) -> dict[str, Any]:
        if self._path is None:
            return {}
        with self._lock:
            try:
                mtime = os.stat(self._path).st_mtime
            except OSError:
                self._mtime, self._data = None, {}
                return {}
            if mtime != self._mtime:
                try:
                    with open(self._path, encoding="utf-8") as fh:
                        loaded = json.load(fh)
                    self._data = loaded if isinstance(loaded, dict) else {}
                except (OSError, ValueError):
                    self._data = {}
                self._mtime = mtime
            return self._data

    def poll_delay(self) -> float:
        """Seconds a poll should hang."""
        value = self._current().get("poll_delay_seconds", 0)
        return float(value) if isinstance(value, int | float) else 0.0

    def probe_delay(self, device_name: str) -> float:
        """Seconds the probe of `device_name` (e.g. `cpu:3`) should hang."""
        delays = self._current().get("probe_delay_seconds", {})
        value = delays.get(device_name, 0) if isinstance(delays, dict) else 0
        return float(value) if isinstance(value, int | float) else 0.0

    def hang(self, delay: float, still: Callable[[], float]) -> None:
        """Sleep up to `delay` seconds, ending early once `still()` is false (the test lifted the fault)."""
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and still() > 0:
            time.sleep(0.05)


class _SlowKernel:
    """A probe kernel whose runs hang while the fault file says so."""

    def __init__(self, inner: ProbeKernel, faults: Faults, device: str) -> None:
        self._inner = inner
        self._faults = faults
        self._device = device
        self.flops_per_step = inner.flops_per_step
        self.footprint_bytes = inner.footprint_bytes

    def run(self, steps: int) -> None:
        delay = self._faults.probe_delay(self._device)
        if delay > 0:
            self._faults.hang(delay, lambda: self._faults.probe_delay(self._device))
        self._inner.run(steps)


class FaultySource:
    """A device source whose reads and probes hang as the fault file says; otherwise the wrapped source."""

    def __init__(self, inner: DeviceSource, faults: Faults) -> None:
        self._inner = inner
        self._faults = faults
        self.name = inner.name
        self.runs_probes = inner.runs_probes

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """The wrapped source's devices."""
        return self._inner.discover()

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """Hang while `poll_delay_seconds` is set, then read."""
        delay = self._faults.poll_delay()
        if delay > 0:
            self._faults.hang(delay, self._faults.poll_delay)
        return self._inner.read_memory(device)

    def make_probe(self, device: DeviceInfo, size: int) -> ProbeKernel | None:
        """The wrapped kernel, hanging while `probe_delay_seconds` names the device."""
        kernel = self._inner.make_probe(device, size)
        return None if kernel is None else _SlowKernel(kernel, self._faults, device.name)
