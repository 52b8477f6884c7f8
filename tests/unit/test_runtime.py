"""The runtime's lifecycle (jaxmon/runtime.py): stop() waits for running polls, within a bound, and stops each
collector only once none of its polls runs, so that no poll has its source closed under it. The nvml collector's
own case (a poll inside a hung NVML call when the runtime stops) is tests/e2e/collectors/test_nvml.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from jaxmon.collectors.base import Collector, CollectorOptions, Update, standalone_context
from jaxmon.runtime import Recorder, Runtime
from jaxmon.snapshot import Snapshot
from tests.helpers import wait_until


class Gated(Collector[CollectorOptions, int]):
    """A collector whose poll blocks until the test opens its gate, and that records what happened to it: a poll
    that finds itself stopped fails, as a source read after its close does."""

    name = "gated"
    description = "test"

    def __init__(self, poll_interval: float = 0.05) -> None:
        super().__init__(CollectorOptions(), standalone_context(None, poll_interval=poll_interval))  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.gate.set()
        self.inside = threading.Event()
        self.stopped = threading.Event()
        self.polls = 0
        self.stopped_during_poll = False
        self.stop_thread: str | None = None

    def update(self) -> Update[int]:
        self.inside.set()
        self.gate.wait(30)
        self.inside.clear()
        if self.stopped.is_set():
            self.stopped_during_poll = True
            raise RuntimeError("read after close")
        self.polls += 1
        return Update(self.polls)

    def families(self, snap: Snapshot, state: int) -> Iterator[Any]:
        return iter(())

    def stop(self) -> None:
        self.stop_thread = threading.current_thread().name
        self.stopped.set()


class Other(Gated):
    name = "other"


def runtime(*collectors: Gated) -> Runtime:
    return Runtime(Recorder(Snapshot()), list(collectors), max_staleness=60.0)


@pytest.fixture
def gated() -> Iterator[Gated]:
    collector = Gated()
    yield collector
    collector.gate.set()  # never leave a poll blocked


def test_stop_waits_for_a_running_poll_then_stops_the_collector(gated: Gated) -> None:
    rt = runtime(gated)
    rt.start()
    wait_until(lambda: rt.ready, what="the first poll")
    gated.gate.clear()
    wait_until(gated.inside.is_set, what="a poll inside the source")
    threading.Timer(0.3, gated.gate.set).start()  # the poll returns while stop() waits
    with capture_logs() as logs:
        rt.stop(wait=30.0)
    assert gated.stopped.is_set()
    assert not gated.stopped_during_poll, "the collector was stopped under its running poll"
    assert rt.snapshot().statuses["gated"].success, "the running poll ended cleanly and was recorded"
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []


def test_a_poll_still_running_after_the_bound_stops_its_collector_when_it_returns(gated: Gated) -> None:
    other = Other()
    rt = runtime(gated, other)
    rt.start()
    wait_until(lambda: rt.ready, what="the first polls")
    gated.gate.clear()  # a hung device: its poll is stuck past any deadline
    wait_until(gated.inside.is_set, what="a poll inside the source")
    with capture_logs() as logs:
        rt.stop(wait=0.2)  # returns: a hung device must not block stop
        assert other.stopped.is_set(), "the idle collector is stopped at once"
        assert not gated.stopped.is_set(), "the hung poll's source is not closed under it"
        polls = other.polls
        gated.gate.set()  # the hung call returns
        wait_until(gated.stopped.is_set, what="the collector stopped once its poll returned")
    assert not gated.stopped_during_poll
    assert gated.stop_thread != threading.current_thread().name  # by the poll's own thread
    assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == [
        "stopping while a poll is still running: its collector stops when the poll returns"
    ]
    assert other.polls == polls, "no poll starts after stop()"


def test_no_job_runs_after_stop_and_stop_twice_stops_each_collector_once(gated: Gated) -> None:
    rt = runtime(gated)
    rt.start()
    wait_until(lambda: rt.ready, what="the first poll")
    rt.stop()
    polls = gated.polls
    calls = []
    gated.stop = lambda: calls.append(1)  # type: ignore[method-assign]
    rt.stop()
    # A job the scheduler handed its pool just before stop() runs after it: it must not poll a stopped source.
    rt.run_job(gated, gated.jobs()[0])
    assert gated.polls == polls
    assert calls == []
    assert not gated.stopped_during_poll
