"""Counters born at zero: every training and compile counter exists at 0 before it counts, so that Prometheus'
`rate()` and `increase()` see all of it, and a restarted process's counters are a reset Prometheus sees.

Prometheus cannot see a series' first value: a counter that appears already holding seconds of badput, or a new
process whose first exposition holds about what the last one ended with, is lost to `increase()`. So:

- `with_zeros()` fills in, at 0, every counter a training reading can have before it happens: each built-in badput
  kind and the kinds the user declared (`collector.training.badput_kinds`), the step histogram, every tracking
  problem's reason, every
  sampled-trace result and, per device, every part. The workload process fills them in (it alone knows the declared
  kinds) and every reader again (a publisher of an older jaxmon).
- `Births` holds each series that is new to this exporter at 0 until a scrape has served it: from then on it counts.
  A series is new when the exporter first renders it: at `start()` (all of the above), a new process's series on the
  spool (a restart: its key has the new pid and start time), or a counter whose first event came later (a badput kind
  not declared, collective bytes once a program's axes are known, FLOPs once a step gave them, a new collective op).
  A scrape is a render of /metrics, `collect[]` or not (`scraped()`, called by jaxmon.exposition): where several
  scrapers read one exporter (Prometheus in pairs, `jaxmon top`), the first one's scrape frees the series, and a
  scrape Prometheus did not store (past its scrape_timeout) frees it too.

Holding loses nothing: the value a series is held from shows up whole at the next render after the scrape, as an
increase Prometheus counts. It only delays a new series by one scrape.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping

from jaxmon.training.reading import DeviceProfile, DeviceTraining, TrainingReading

# The built-in badput kinds (jaxmon.training.accounting, handed.EVENT_KINDS), the tracker's problem reasons, and the
# sampled traces' results and parts (jaxmon.training.sampler): a daemon loads none of those modules, and
# tests/unit/test_births.py holds these to them.
BADPUT_KINDS = ("startup", "compile", "checkpoint", "restore", "host", "restart", "stall")
PROBLEM_REASONS = (
    "back", "jump", "unready", "invalid", "unread", "dropped", "cost", "badput_kinds", "intervals", "programs",
    "communication", "error",
)  # fmt: skip
PROFILE_RESULTS = ("taken", "busy", "failed", "skipped")
# The step histogram's bounds (jaxmon.training.accounting.DURATION_BUCKETS): at 0 before the first step.
DURATION_BOUNDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0, 600.0,
)  # fmt: skip
PROFILE_PARTS = ("compute", "collective", "copy", "idle")

_counter = itertools.count(1)
_scrapes = 0


def scraped() -> None:
    """A /metrics render was served (jaxmon.exposition)."""
    global _scrapes
    _scrapes = next(_counter)  # next() on a count is atomic under the GIL


def scrape_count() -> int:
    """Scrapes served by this process so far."""
    return _scrapes


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


class Births:
    """Which series have been served by a scrape: a new one reads 0 until then. One per collector; `begin()` and
    `end()` around each poll forget the series no reading had (a process gone from the spool)."""

    def __init__(self, scrapes: Callable[[], int] = scrape_count) -> None:
        self._scrapes = scrapes
        self._lock = threading.Lock()
        self._born: dict[Hashable, int] = {}  # held series: the scrape count when first seen
        self._free: set[Hashable] = set()  # series a scrape has served
        self._seen: set[Hashable] = set()
        self._now = 0

    def begin(self) -> None:
        """A poll starts."""
        self._now = self._scrapes()
        self._seen = set()

    def end(self) -> None:
        """A poll ended: forget the series it did not see."""
        with self._lock:
            self._born = {k: v for k, v in self._born.items() if k in self._seen}
            self._free &= self._seen

    def counts(self, key: Hashable) -> bool:
        """Whether the series `key` counts now (a scrape served it since it was first seen), noting it seen."""
        with self._lock:
            self._seen.add(key)
            if key in self._free:
                return True
            born = self._born.setdefault(key, self._now)
            if self._now > born:
                del self._born[key]
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
