"""A process under jaxmon.start() whose own prometheus_client collector blocks in collect() until told to return,
run as a child by tests/e2e/test_user_collectors.py.

Usage: stuck_collector.py (JAXMON_* settings, the web config included, from the environment). Answers
`OK {"url": ...}`, then reads commands on stdin, each answered with `OK <json>`:
  entered   wait (up to 60 s) until a scrape is inside the collector's collect(); answer whether one is
  release   let every collect() return (it yields `stuck_value 1`)
  exit
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import jaxmon
from jaxmon.logsetup import configure_logging
from tests.workloads.protocol import answer


class Stuck(Collector):
    """The user's collector: collect() waits for `release` (at most 60 s)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.entered.set()
        self.release.wait(60)
        yield GaugeMetricFamily("stuck_value", "The stuck collector's own.", value=1)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no collect() at register time: only scrapes enter it


def main() -> None:
    configure_logging("info", "json", stream=sys.stderr)
    stuck = Stuck()
    REGISTRY.register(stuck)
    exporter = jaxmon.start(0, workload="stuck", collector={"probe": False})
    answer(url=exporter.url, port=exporter.port)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "entered":
            answer(entered=stuck.entered.wait(60))
        elif cmd == "release":
            stuck.release.set()
            answer(released=True)
        elif cmd == "exit":
            break
    stuck.release.set()
    exporter.stop()
    answer(stopped=True)


if __name__ == "__main__":
    main()
