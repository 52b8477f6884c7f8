"""An embedded exporter's last word: a stopping flag, and a wait at stop for the scrape that reads it.

A training job that ends is not an outage. The embedded exporter (`jaxmon.start()`) serves the flag
(metrics.EXPORTER_STOPPING) at 0 while it runs; `stop()` (called by the script, or at interpreter exit) sets it to 1
and, where a scraper has come at least twice, waits for one more scrape (at most 1.5 x the interval between the last two
scrapes + 1 s, and never over `MAX_WAIT`) before it stops serving. Prometheus then holds a last sample saying the
exporter stopped on purpose, which `JaxmonExporterDown` reads (deploy/prometheus/alerts.yml, docs/alerts.md) to tell
a job that finished from one that died. A process that crashes, or is killed, never says it.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client.core import Metric

from jaxmon.catalog import metrics
from jaxmon.families import add

# The longest stop() waits for the final scrape: a scrape interval of up to 40 s fits (1.5 x 40 + 1).
MAX_WAIT = 61.0


class LastWord:
    """The stopping flag, and the scrapes seen (unfiltered /metrics renders), for stop() to wait on one more."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.stopping = False
        self.scrapes = 0
        self._times: deque[float] = deque(maxlen=2)

    def family(self) -> Metric:
        """The stopping flag now."""
        fam = metrics.EXPORTER_STOPPING.new()
        add(fam, {}, 1.0 if self.stopping else 0.0)
        return fam

    def scraped(self) -> None:
        """A scrape rendered the exposition (with `family()` in it)."""
        with self._cond:
            self.scrapes += 1
            self._times.append(time.monotonic())
            self._cond.notify_all()

    def wait_for(self) -> float:
        """How long stop() waits for the next scrape: 0 unless a scraper came twice (its interval unknown)."""
        with self._cond:
            if len(self._times) < 2:
                return 0.0
            interval = self._times[1] - self._times[0]
        return min(1.5 * interval + 1.0, MAX_WAIT)

    def stop(self, most: float | None = None) -> bool:
        """Say stopping, and wait for one more scrape (up to `wait_for()`, or `most`): whether one came."""
        wait = self.wait_for() if most is None else min(most, self.wait_for())
        with self._cond:
            self.stopping = True
            seen = self.scrapes
            if wait <= 0:
                return False
            return self._cond.wait_for(lambda: self.scrapes > seen, timeout=wait)
