"""A training loop under jaxmon.start() whose new badput kinds are born while a Prometheus scrape is rendering, run as
a child by tests/e2e/test_counters_through_prometheus.py.

Usage: births_in_render.py PORT. A collector of the loop's own in prometheus_client's default registry (the exposition
reads it at each scrape, after the scrape took its births ticket and read jaxmon's snapshot, before its response is
handed over: jaxmon.exposition) holds the scrape that enters it while a birth is due. Answers `OK {"url": ...}` once
two steps are booked, then reads commands on stdin, each answered with `OK <json>`:
  births N   N new badput kinds, each born inside one scrape's render: wait (up to 5 s) for a scrape to enter the
             collector; open a `jaxmon.badput()` block of a new kind, close it 30 ms later, book one step (which books
             its seconds); wait until a poll has the series with its seconds (read from the exporter's own
             /metrics?collect[]=training, as a reader that is not Prometheus, served the values unheld); then let the
             scrape go. Answer per kind with the Unix times the scrape entered the collector, the block opened, the
             poll had it, and the collector returned, and the block's seconds as the loop timed them
  exit
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import jax.numpy as jnp
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import jaxmon
from jaxmon.logsetup import configure_logging
from tests.helpers import parse_samples
from tests.workloads.protocol import answer, booked

# The longest a scrape is held in the collector (the exposition waits for it up to 2 s: the default_registry timeout).
HOLD = 1.0


@dataclass
class Hold:
    """One scrape held in the collector while a birth happens."""

    entered: threading.Event = field(default_factory=threading.Event)
    leave: threading.Event = field(default_factory=threading.Event)
    left: threading.Event = field(default_factory=threading.Event)
    times: dict[str, float] = field(default_factory=dict)  # Unix times: entered, left


class Gate(Collector):
    """The loop's own collector: a scrape that enters collect() while a hold is due waits there for the birth."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: Hold | None = None

    def due(self, hold: Hold | None) -> None:
        with self._lock:
            self._due = hold

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            hold, self._due = self._due, None
        if hold is not None:
            hold.times["entered"] = time.time()
            hold.entered.set()
            hold.leave.wait(HOLD)
            hold.times["left"] = time.time()
            hold.left.set()
        yield GaugeMetricFamily("births_gate_up", "The births workload's own collector.", value=1)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no collect() at register time: only scrapes enter it


def seconds_seen(url: str, kind: str) -> float:
    """The kind's badput seconds as the exporter serves them to a reader that is not Prometheus (0 where absent)."""
    with urllib.request.urlopen(url + "/metrics?collect[]=training", timeout=5) as r:
        samples = parse_samples(r.read().decode())
    name = "jaxmon_training_badput_seconds_total"
    return next((v for (n, labels), v in samples.items() if n == name and ("kind", kind) in labels), 0.0)


def main() -> None:
    configure_logging("info", "json", stream=sys.stderr)
    gate = Gate()
    REGISTRY.register(gate)
    exporter = jaxmon.start(int(sys.argv[1]), workload="born", poll={"interval": 0.1}, collector={"probe": False})
    url = exporter.url
    assert url is not None  # it serves on a port
    tiny = jax.jit(lambda a: a * 1.0001)
    out = tiny(jnp.ones(4)).block_until_ready()
    number = 0

    def step() -> None:
        nonlocal out, number
        out = tiny(out)
        jaxmon.step(number, out)
        out.block_until_ready()
        booked(number)
        number += 1

    step()
    step()
    answer(url=url, pid=os.getpid())
    kinds = 0
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "births":
            born = []
            for _ in range(int(rest[0])):
                kind = f"born{kinds}"
                kinds += 1
                hold = Hold()
                gate.due(hold)
                if not hold.entered.wait(5):
                    gate.due(None)
                    raise AssertionError("no scrape entered the collector in 5 s")
                opened, opened_unix = time.monotonic(), time.time()
                with jaxmon.badput(kind):
                    time.sleep(0.03)
                loop_seconds = time.monotonic() - opened
                step()
                deadline = time.monotonic() + HOLD
                while seconds_seen(url, kind) <= 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen = time.time() if seconds_seen(url, kind) > 0 else None
                hold.leave.set()
                hold.left.wait(5)
                born.append({"kind": kind, "opened": opened_unix, "seen": seen, "seconds": loop_seconds, **hold.times})
            answer(born=born)
        elif cmd == "exit":
            break
    exporter.stop()
    answer(stopped=True)


if __name__ == "__main__":
    main()
