"""The probe's persisted baselines (`--collector.probe.baseline-file`): a restart reuses a calibration taken idle.

A sidecar restarted beside training that is already running would otherwise calibrate under load and read the
busy device as idle from then on. Entries are keyed by everything that makes a baseline valid: the device
(platform, id, kind), the jax and jaxlib versions, the probe size and the calibration target.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from jaxmon.files import write_atomically

log = structlog.get_logger("jaxmon.probe_baseline")

SCHEMA = "jaxmon.probe-baseline/1"


@dataclass(frozen=True)
class Baseline:
    """One calibration: the step count and the idle latency it gave."""

    steps: int
    seconds: float


class BaselineStore:
    """A JSON file of baselines; unreadable or foreign content is logged and ignored (then overwritten)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, float]] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("schema") == SCHEMA and isinstance(data.get("entries"), dict):
                self._entries = {
                    k: v
                    for k, v in data["entries"].items()
                    if isinstance(v, dict) and _valid(v.get("steps"), v.get("seconds"))
                }
            else:
                log.warning("probe baseline file ignored: not a jaxmon baseline file", file=str(path))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("probe baseline file ignored", file=str(path), error=str(exc))

    def get(self, key: str) -> Baseline | None:
        """The saved baseline for `key`, if any."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else Baseline(int(entry["steps"]), float(entry["seconds"]))

    def put(self, key: str, baseline: Baseline) -> None:
        """Save `baseline` under `key` (the whole file is replaced atomically); a write error is logged."""
        with self._lock:
            self._entries[key] = {"steps": baseline.steps, "seconds": baseline.seconds, "saved": time.time()}
            payload = {"schema": SCHEMA, "entries": dict(self._entries)}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(self.path, payload)
            except OSError as exc:
                log.error("probe baseline not saved", file=str(self.path), error=str(exc))


def _valid(steps: object, seconds: object) -> bool:
    return (
        isinstance(steps, int)
        and not isinstance(steps, bool)
        and steps >= 1
        and isinstance(seconds, float | int)
        and 0 < seconds < 60
    )
