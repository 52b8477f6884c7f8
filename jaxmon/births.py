"""Counters born at zero: every training and compile counter exists at 0 before it counts, so that Prometheus'
`rate()` and `increase()` see all of it, and a restarted process's counters are a reset Prometheus sees.

Prometheus cannot see a series' first value: a counter that appears already holding seconds of badput, or a new
process whose first exposition holds about what the last one ended with, is lost to `increase()`. So:

- `with_zeros()` fills in, at 0, every counter a training reading can have before it happens: each built-in badput
  kind and the kinds the user declared (`collector.training.badput_kinds`), the step histogram, every tracking
  problem's reason, every
  sampled-trace result and, per device, every part. The workload process fills them in (it alone knows the declared
  kinds) and every reader again (a publisher of an older jaxmon).
- `Births` holds each series that is new to this exporter at 0 until a Prometheus scrape has been served it: from
  then on it counts. A series is new when the exporter first renders it: at `start()` (all of the above), a new
  process's series on the spool (a restart: its key has the new pid and start time), or a counter whose first event
  came later (a badput kind not declared, collective bytes once a program's axes are known, FLOPs once a step gave
  them, a new collective op).

Which scrapes free a held series (`Scrapes`, fed by jaxmon.exposition and the web app): only a scraper that
identifies as Prometheus (jaxmon.scrapers: its User-Agent, or its X-Prometheus-Scrape-Timeout-Seconds header, which
every Prometheus-compatible scraper sends), never `jaxmon top`, curl or a browser, and only once its response was
handed to the connection whole. A scrape takes a ticket when it reads the snapshot; a series first held in poll k is
freed at a poll after a scrape whose ticket was taken after poll k+1 began has been served: that scrape read a
snapshot holding the 0 (poll k's or k+1's), never one from before the series was held, whatever the scrape and the
polls did at once. A series that goes (a process silent past the spool's TTL, an exporter stopped and started
again in one process) and comes back under the same key is not held again: it was served, and a 0 between its two
values would be counted as a reset.

Holding loses nothing: the value a series is held from shows up whole after the scrape, as an increase Prometheus
counts. It only delays a new series by a poll and a scrape, and only for Prometheus: every other reader (`jaxmon
top`, curl) is served the counters at their values (each holding collector's `unheld()`; jaxmon.exposition renders
both).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping

from jaxmon.catalog import metrics
from jaxmon.training_readings import DeviceProfile, DeviceTraining, TrainingReading

# The keys each counter is born with at zero (the catalog's `zeros`); tests/unit/test_births.py holds them to the
# tracker's (jaxmon.training), which a daemon does not load.
BADPUT_KINDS = metrics.TRAINING_BADPUT_SECONDS.zeros_keys()
PROBLEM_REASONS = metrics.TRAINING_TRACKING_PROBLEMS.zeros_keys()
PROFILE_RESULTS = metrics.TRAINING_PROFILES.zeros_keys()
PROFILE_PARTS = metrics.TRAINING_PROFILE_SECONDS.zeros_keys()
# The step histogram's bounds: every bucket at 0 before the first step.
DURATION_BOUNDS = metrics.TRAINING_STEP_DURATION_SECONDS.buckets


class Scrapes:
    """The Prometheus scrapes of this process's exposition: a ticket taken as a scrape reads the snapshot
    (`take()`), and the highest ticket of a scrape served whole (`served()`)."""

    def __init__(self) -> None:
        self._tickets = itertools.count(1)
        self._taken = 0
        self._proof = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        """A Prometheus scrape reads the snapshot now: its ticket."""
        with self._lock:
            self._taken = next(self._tickets)
            return self._taken

    def served(self, ticket: int) -> None:
        """The scrape of `ticket` was handed to its connection whole."""
        with self._lock:
            self._proof = max(self._proof, ticket)

    def taken(self) -> int:
        """Tickets taken so far."""
        return self._taken

    def proof(self) -> int:
        """The highest ticket of a scrape served."""
        return self._proof

    def serve_one(self) -> None:
        """A whole Prometheus scrape, at once (tests, and jaxmon snapshot's one render)."""
        self.served(self.take())


# The process's scrapes: every exposition of the process (an embedded exporter and a daemon alike) reports here.
SCRAPES = Scrapes()


def _filled(values: Mapping[str, float], names: Iterable[str]) -> dict[str, float]:
    out = dict.fromkeys(names, 0.0)
    out.update(values)
    return out


def with_zeros(reading: TrainingReading, kinds: Iterable[str] = ()) -> TrainingReading:
    """`reading` with every counter it can have before it happens at 0 (its own values kept)."""
    profile = reading.profile
    if profile is not None:
        profile = dataclasses.replace(
            profile,
            results={**dict.fromkeys(PROFILE_RESULTS, 0), **profile.results},
            devices=tuple(dataclasses.replace(p, parts=_filled(p.parts, PROFILE_PARTS)) for p in profile.devices),
        )
    buckets = reading.duration_buckets or tuple((b, 0) for b in (*DURATION_BOUNDS, float("inf")))
    return dataclasses.replace(
        reading,
        duration_buckets=buckets,
        badput_seconds_total=_filled(reading.badput_seconds_total, (*BADPUT_KINDS, *kinds)),
        problems={**dict.fromkeys(PROBLEM_REASONS, 0), **reading.problems},
        profile=profile,
    )


# How long a series that went keeps its "served" standing, and how many such series are kept (the oldest go first).
GONE_MEMORY = 3600.0
MAX_GONE = 100_000
_PENDING = -1  # held, first seen in the current poll: its marker is set at the next poll


class Births:
    """Which series have been served by a Prometheus scrape: a new one reads 0 until then. One per collector (or
    one per process, `for_process()`); `begin()` and `end()` around each poll forget the series no reading had (a
    process gone from the spool), remembering for GONE_MEMORY seconds those that were served."""

    def __init__(
        self,
        proof: Callable[[], int] = SCRAPES.proof,
        taken: Callable[[], int] = SCRAPES.taken,
    ) -> None:
        self._proof_of = proof
        self._taken_of = taken
        self._lock = threading.Lock()
        self._held: dict[Hashable, int] = {}  # held series: the ticket count their wait is measured from
        self._free: set[Hashable] = set()  # series a scrape has served
        self._gone: dict[Hashable, float] = {}  # served series no poll has had since, by when they went
        self._seen: set[Hashable] = set()
        self._proof = 0
        self._taken = 0

    def begin(self) -> None:
        """A poll starts."""
        self._proof = self._proof_of()
        self._taken = self._taken_of()
        self._seen = set()

    def end(self, now: float | None = None) -> None:
        """A poll ended: forget the series it did not see (those served are remembered a while)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._held = {k: v for k, v in self._held.items() if k in self._seen}
            for key in self._free - self._seen:
                self._gone[key] = now
            self._free &= self._seen
            if self._gone:
                self._gone = {k: t for k, t in self._gone.items() if now - t < GONE_MEMORY}
                while len(self._gone) > MAX_GONE:
                    del self._gone[next(iter(self._gone))]

    def counts(self, key: Hashable) -> bool:
        """Whether the series `key` counts now (a scrape served it held), noting it seen."""
        with self._lock:
            self._seen.add(key)
            if key in self._free:
                return True
            if self._gone.pop(key, None) is not None:  # back: it was served before it went
                self._free.add(key)
                return True
            marker = self._held.get(key)
            if marker is None:
                self._held[key] = _PENDING
                return False
            if marker == _PENDING:
                self._held[key] = self._taken
                return False
            if self._proof > marker:
                del self._held[key]
                self._free.add(key)
                return True
            return False

    def value(self, key: Hashable, value: float) -> float:
        """`value`, or 0 while the series is held."""
        return value if self.counts(key) else 0.0

    def compile(self, prefix: Hashable, counters: Mapping[str, float]) -> dict[str, float]:
        """Compile counters (jaxmon.sources.local.workload.CompileCounters) as they may be served."""
        return {name: self.value((prefix, "compile", name), v) for name, v in counters.items()}

    def training(self, prefix: Hashable, reading: TrainingReading) -> TrainingReading:
        """A training reading as it may be served: every counter series still held reads 0 (gauges as they are)."""
        v = self.value
        held = reading.duration_buckets and not self.counts((prefix, "duration"))
        profile = reading.profile
        if profile is not None:
            profile = dataclasses.replace(
                profile,
                results={r: int(v((prefix, "profiles", r), n)) for r, n in profile.results.items()},
                devices=tuple(self._profile(prefix, p) for p in profile.devices),
            )
        return dataclasses.replace(
            reading,
            steps_total=int(v((prefix, "steps"), reading.steps_total)),
            duration_buckets=tuple((b, 0) for b, _ in reading.duration_buckets) if held else reading.duration_buckets,
            duration_sum=0.0 if held else reading.duration_sum,
            examples_total=v((prefix, "examples"), reading.examples_total),
            tokens_total=v((prefix, "tokens"), reading.tokens_total),
            host_wait_seconds_total=v((prefix, "host_wait"), reading.host_wait_seconds_total),
            productive_seconds_total=v((prefix, "productive"), reading.productive_seconds_total),
            badput_seconds_total={k: v((prefix, "badput", k), s) for k, s in reading.badput_seconds_total.items()},
            problems={r: int(v((prefix, "problems", r), n)) for r, n in reading.problems.items()},
            devices=tuple(self._device(prefix, d) for d in reading.devices),
            profile=profile,
        )

    def _device(self, prefix: Hashable, d: DeviceTraining) -> DeviceTraining:
        key = (prefix, d.platform, d.id)

        def opt(name: str, value: float | None) -> float | None:
            return None if value is None else self.value((key, name), value)

        return dataclasses.replace(
            d,
            model_flops_total=opt("model_flops", d.model_flops_total),
            hardware_flops_total=opt("hardware_flops", d.hardware_flops_total),
            hardware_bytes_total=opt("hardware_bytes", d.hardware_bytes_total),
            collective_bytes_total={
                group: self.value((key, "collective", group), moved)
                for group, moved in d.collective_bytes_total.items()
            },
        )

    def _profile(self, prefix: Hashable, p: DeviceProfile) -> DeviceProfile:
        key = (prefix, "profile", p.platform, p.id)
        return DeviceProfile(
            platform=p.platform,
            id=p.id,
            profiled_seconds_total=self.value((key, "profiled"), p.profiled_seconds_total),
            parts={part: self.value((key, "part", part), s) for part, s in p.parts.items()},
            collectives={op: self.value((key, "op", op), s) for op, s in p.collectives.items()},
            placed={
                place: (
                    self.value((key, "placed", place, "seconds"), seconds),
                    self.value((key, "placed", place, "exposed"), exposed),
                    self.value((key, "placed", place, "bytes"), moved),
                )
                for place, (seconds, exposed, moved) in p.placed.items()
            },
            copies={
                direction: (
                    self.value((key, "copy", direction, "seconds"), seconds),
                    self.value((key, "copy", direction, "bytes"), moved),
                )
                for direction, (seconds, moved) in p.copies.items()
            },
            sample_wait_ratio=p.sample_wait_ratio,  # a gauge: as it is
        )


_process_births: dict[str, Births] = {}
_process_lock = threading.Lock()


def for_process(name: str) -> Births:
    """This process's Births for the in-process collector `name`: a series one embedded exporter served is not held
    again by the next one started in the same process (the compile counters count on across stop() and start(), so
    a 0 between would be counted as a reset). Keys name what makes a series new (the workload, a tracker's start)."""
    with _process_lock:
        births = _process_births.get(name)
        if births is None:
            births = _process_births[name] = Births()
        return births
