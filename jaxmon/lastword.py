"""An embedded exporter's last word: how its process is ending, served to every Prometheus that scrapes it, and the
bounded wait at the end for the scrapes that read it.

A training job that ends is not an outage, and one that crashed is. The embedded exporter (`jaxmon.start()`) serves
`jaxmon_exporter_stopping 0` while it runs. When the process ends, the exporter says how, once
(`jaxmon_exporter_exit_info{reason}`):

- `normal`: `jaxmon.stop()` or the `Exporter`'s `stop()`, or the interpreter's exit without an uncaught exception;
  `jaxmon_exporter_stopping` then reads 1, which `jaxmon:exporter_stopped` and `JaxmonExporterDown` read (a job that
  finished);
- `exception`: an uncaught exception ends the script (it leaves through the interpreter's normal exit, but it is a
  crash: stopping stays 0);
- `signal`: SIGTERM (jaxmon's handler, jaxmon.embedded) or SIGINT (KeyboardInterrupt), with the signal's name.

A process killed outright (SIGKILL, the OOM killer, a segfault) says nothing: its target goes down without a word,
which `JaxmonTrainingCrashed` reads as a crash too.

Then it waits for every Prometheus that scrapes it regularly to be served the word (jaxmon.scrapers tells a
Prometheus from `jaxmon top` or curl, and one Prometheus from another), and no longer: a scraper counts once a
scrape that rendered the word was handed to its connection whole (a scrape already rendering when the word was said
does not count), and each is waited for until its next scrape is due, 1.5 of its intervals and 1 s after its last
one, never past MAX_WAIT in all. A scraper seen only once (its interval unknown), or not for two of its intervals,
is not waited for. Where one scraper key hides two Prometheus servers (one host, one User-Agent, one timeout),
the scrapes it makes within half its interval are each owed the word.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from prometheus_client.core import Metric

from jaxmon.catalog import metrics
from jaxmon.families import add
from jaxmon.scrapers import MetricsRequest

# The longest stop() waits for the final scrapes: a scrape interval of up to 40 s fits (1.5 x 40 + 1).
MAX_WAIT = 61.0
# MetricsRequest times kept per scraper: its interval is the longest gap between the last of them.
KEEP = 5

NORMAL, EXCEPTION, SIGNAL = "normal", "exception", "signal"
REASONS = (NORMAL, EXCEPTION, SIGNAL)


class LastWord:
    """The exporter's word on how its process ends, and the Prometheus scrapes served (per scraper), for stop() to
    wait on the scrapes that read it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self.reason: str | None = None
        self.signal = ""
        self._times: dict[Hashable, deque[float]] = {}  # served Prometheus scrapes, per scraper
        self._finals: dict[Hashable, int] = {}  # of them, those that rendered the word
        self.waited_for = 0  # the regular scrapers the last stop() waited for

    @property
    def stopping(self) -> bool:
        """Whether the exporter stops on purpose (a normal end)."""
        return self.reason == NORMAL

    def families(self) -> tuple[list[Metric], bool]:
        """`jaxmon_exporter_stopping` and, once said, `jaxmon_exporter_exit_info`; and whether they hold the word."""
        reason, signal = self.reason, self.signal
        stopping = metrics.EXPORTER_STOPPING.new()
        add(stopping, {}, 1.0 if reason == NORMAL else 0.0)
        if reason is None:
            return [stopping], False
        info = metrics.EXPORTER_EXIT_INFO.new()
        add(info, {"reason": reason, "signal": signal}, 1.0)
        return [stopping, info], True

    def served(self, scrape: MetricsRequest) -> None:
        """A scrape that rendered `families()` was handed to its connection whole."""
        if not scrape.scraper.prometheus:
            return  # jaxmon top, curl: neither scrapers to wait for nor readers of the word
        key = scrape.scraper.key
        with self._cond:
            self._times.setdefault(key, deque(maxlen=KEEP)).append(self._clock())
            if scrape.final:
                self._finals[key] = self._finals.get(key, 0) + 1
            self._cond.notify_all()

    def owed(self, now: float) -> dict[Hashable, tuple[int, float]]:
        """Each scraper that comes regularly: how many renders of the word it is owed, and until when it is waited
        for."""
        out: dict[Hashable, tuple[int, float]] = {}
        for key, times in self._times.items():
            if len(times) < 2:
                continue  # its interval is unknown
            gaps = [b - a for a, b in zip(times, list(times)[1:], strict=False)]
            interval = max(gaps)
            last = times[-1]
            if now - last > 2 * interval + 1.0:
                continue  # it stopped coming
            count = sum(1 for t in times if t > last - 0.5 * interval)
            out[key] = (count, last + 1.5 * interval + 1.0)
        return out

    def wait_for(self) -> float:
        """How long stop() would wait at most now: until the last regular scraper's next scrape is due."""
        with self._cond:
            now = self._clock()
            deadlines = [deadline for _, deadline in self.owed(now).values()]
        return min(max(deadlines) - now, MAX_WAIT) if deadlines else 0.0

    def say(self, reason: str, signal: str = "") -> bool:
        """Say how the process ends (`REASONS`); the first word stands. Whether this one was said."""
        with self._cond:
            if self.reason is not None:
                return False
            self.reason, self.signal = reason, signal
            self._finals.clear()
            self._cond.notify_all()
            return True

    def stop(self, reason: str = NORMAL, signal: str = "", most: float | None = None) -> bool:
        """Say `reason` (unless a word was said) and wait until every regular Prometheus scraper has been served it,
        each until its next scrape is due, all within MAX_WAIT (or `most`): whether every one was."""
        self.say(reason, signal)
        with self._cond:
            start = self._clock()
            owed = self.owed(start)
            self.waited_for = len(owed)
            end = start + min(MAX_WAIT, MAX_WAIT if most is None else most)

            def outstanding() -> list[float]:
                now = self._clock()
                return [
                    deadline
                    for key, (count, deadline) in owed.items()
                    if self._finals.get(key, 0) < count and deadline > now
                ]

            while True:
                waiting = outstanding()
                now = self._clock()
                if not waiting or now >= end:
                    break
                self._cond.wait(min(max(waiting), end) - now)
            return all(self._finals.get(key, 0) >= count for key, (count, _) in owed.items())
