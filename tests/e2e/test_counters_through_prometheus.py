"""Counters as a real Prometheus stores them, read back as raw samples (each series' every stored value in a range),
with the increase computed over them as increase() does, less its extrapolation: a reset (a value below the one before)
restarts the count from 0. Each double count jaxmon's births used to make is one such reset that is no restart
(jaxmon.births):

- an embedded exporter stopped and started again in one process (`jaxmon.stop()`, `jaxmon.start()`): its compile
  counters, the process's, count on; they read 8 -> 0 -> 10 (increase() 18 for 10 compilations);
- a publisher silent past the sidecar's spool TTL that writes again: its series go and come back with the values
  they had; they read 3 -> gone -> 0 -> 3 (a reset: 3 more);
- a reader that is not Prometheus (`jaxmon top`, curl) that reads first: a new series is held at 0 for Prometheus all
  the same; it appeared at its full value, whose increase no Prometheus saw;
- a series born while a scrape is rendering (after it read the snapshot, before it was served): that scrape never
  served its 0, yet freed it; it appeared at its full value.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import StartDaemon, sidecar_args
from tests.helpers import ROOT, Child, free_port, wait_until
from tests.prometheus import Prometheus

SCRAPE = "500ms"


def prometheus_of(tmp: Path, target: str, interval: str = SCRAPE, timeout: str = "450ms") -> Prometheus:
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": timeout, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": "jaxmon-births", "static_configs": [{"targets": [target]}]}],
    }
    p = Prometheus(tmp, config)
    p.wait_ready()
    return p


def raw(p: Prometheus, selector: str) -> list[float]:
    """Every value Prometheus stored of the one series `selector` names in the last 5 minutes, in order."""
    got = p.query(f"{selector}[5m]")
    assert len(got) == 1, got
    return [float(v) for _, v in got[0]["values"]]


def counted(values: list[float]) -> float:
    """What increase() counts over `values` without its extrapolation: each rise, and after a reset the value."""
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(values))


def booked(p: Prometheus, selector: str) -> bool:
    return (latest(p, selector) or 0) > 0


def latest(p: Prometheus, selector: str) -> float | None:
    got = p.query(selector)
    return float(got[0]["value"][1]) if got else None


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[list[Prometheus]]:
    started: list[Prometheus] = []
    yield started
    for p in started:
        p.stop()


def test_an_exporter_stopped_and_started_again_in_its_process_counts_on(
    tmp_path: Path, children: list[Child], prometheus: list[Prometheus]
) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    child = Child(tmp_path, "embedded", "--port", str(port), "--workload", "again", "--interval", "0.2")
    children.append(child)
    p = prometheus_of(tmp_path, target)
    prometheus.append(p)
    series = 'jaxmon_jit_compilations_total{workload="again"}'
    assert child.send("compile 8") == {"compiled": 8}
    wait_until(lambda: (latest(p, series) or 0) >= 8, 30, "8 compilations in Prometheus")
    time.sleep(1.0)  # the loop's own compilations booked too
    before = latest(p, series)
    assert before is not None
    restarted = time.time()
    child.send("restart-exporter")
    wait_until(lambda: scraped_since(p, target, restarted + 1.0), 30, "the new exporter scraped")
    assert child.send("compile 2") == {"compiled": 10}
    wait_until(lambda: latest(p, series) == before + 2, 30, "2 compilations more in Prometheus")
    values = raw(p, series)
    assert values == sorted(values), values  # no reset: the stop and start is no restart of the process's counter
    assert counted(values) == values[-1] - values[0]


def scraped_since(p: Prometheus, target: str, since: float) -> bool:
    got = p.query(f'timestamp(up{{instance="{target}"}} == 1)')
    return bool(got) and float(got[0]["value"][1]) > since


def test_a_publisher_silent_past_the_ttl_comes_back_with_its_values(
    tmp_path: Path, start_daemon: StartDaemon, children: list[Child], prometheus: list[Prometheus]
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    daemon = start_daemon(*sidecar_args(spool), "--collector.spool.ttl", "1s")
    child = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "silent", "--interval", "0.2")
    children.append(child)
    p = prometheus_of(tmp_path, daemon.url.removeprefix("http://"))
    prometheus.append(p)
    series = 'jaxmon_training_steps_total{workload="silent"}'
    child.send("steps 3")
    wait_until(lambda: latest(p, series) == 3, 30, "3 steps in Prometheus")
    os.kill(child.proc.pid, signal.SIGSTOP)  # the publisher is silent: its file ages past the TTL
    try:
        wait_until(lambda: latest(p, series) is None, 30, "the workload gone")
        time.sleep(1.0)
    finally:
        os.kill(child.proc.pid, signal.SIGCONT)
    wait_until(lambda: latest(p, series) == 3, 30, "the workload back")
    child.send("steps 2")
    wait_until(lambda: latest(p, series) == 5, 30, "5 steps in Prometheus")
    values = raw(p, series)
    assert 0.0 not in values[values.index(3.0) :], values  # never held at 0 again
    assert counted(values) == 5 - values[0]


def test_a_reader_that_is_not_prometheus_never_frees_a_held_series(
    tmp_path: Path, children: list[Child], prometheus: list[Prometheus]
) -> None:
    """A badput kind not declared is born at its first open, held at 0 until Prometheus was served that 0: here curl
    reads the exporter fifty times a second from its start (as `jaxmon top` may), Prometheus every half second, and
    the block is closed well within Prometheus' interval. Prometheus' first value of it is 0, so all its seconds
    count."""
    port = free_port()
    target = f"127.0.0.1:{port}"
    child = Child(tmp_path, "embedded", "--port", str(port), "--workload", "first", "--interval", "0.05")
    children.append(child)
    stop = threading.Event()

    def curl() -> None:
        while not stop.is_set():
            with contextlib.suppress(requests.RequestException):
                requests.get(f"http://{target}/metrics", timeout=1)
            time.sleep(0.02)

    reader = threading.Thread(target=curl, daemon=True)
    reader.start()
    try:
        p = prometheus_of(tmp_path, target)
        prometheus.append(p)
        child.send("steps 2")
        wait_until(lambda: latest(p, 'jaxmon_training_steps_total{workload="first"}') == 2, 30, "2 steps")
        results: list[dict[str, Any]] = []
        for kind in ("warmup", "reshard", "sync"):
            child.send(f"hold {kind}")
            time.sleep(0.1)  # curl has read the new series several times; Prometheus most likely not
            results.append(child.send("release"))
            child.send("steps 1")  # the block's seconds are booked at the next step's completion
        series = {kind: f'jaxmon_training_badput_seconds_total{{workload="first", kind="{kind}"}}' for kind in
                  ("warmup", "reshard", "sync")}  # fmt: skip
        for kind, selector in series.items():
            wait_until(functools.partial(booked, p, selector), 30, f"{kind} seconds in Prometheus")
        for kind, selector in series.items():
            values = raw(p, selector)
            assert values[0] == 0.0, (kind, values)  # Prometheus saw it born
            assert counted(values) == values[-1] > 0, (kind, values)
    finally:
        stop.set()


BIRTHS = ROOT / "tests" / "workloads" / "births_in_render.py"


def stored_scrapes(p: Prometheus, target: str) -> list[tuple[float, float]]:
    """When each scrape of `target` that Prometheus stored began and ended (Unix times), from its own raw samples of
    up (1: stored) and scrape_duration_seconds."""
    (up,) = p.query(f'up{{instance="{target}"}}[5m]')
    (took,) = p.query(f'scrape_duration_seconds{{instance="{target}"}}[5m]')
    ok = {float(t) for t, v in up["values"] if v == "1"}
    return [(float(t), float(t) + float(d)) for t, d in took["values"] if float(t) in ok]


def test_a_series_born_while_a_scrape_renders_is_first_stored_at_zero(
    tmp_path: Path, children: list[Child], prometheus: list[Prometheus]
) -> None:
    """A new badput kind is born inside a Prometheus scrape's render: a collector of the loop's own, which the
    exposition reads after the scrape took its ticket and read the snapshot, holds the scrape while the loop opens and
    closes the block, books its seconds and sees a poll have them. That scrape read no 0 of the series; it is freed
    only after a later scrape was served its 0, so Prometheus stores 0 first and counts all its seconds."""
    port = free_port()
    target = f"127.0.0.1:{port}"
    child = Child(tmp_path, str(port), script=BIRTHS)
    children.append(child)
    p = prometheus_of(tmp_path, target, "1s", "900ms")
    prometheus.append(p)
    wait_until(lambda: latest(p, 'jaxmon_training_steps_total{workload="born"}') == 2, 30, "2 steps in Prometheus")
    born = child.send("births 4")["born"]
    kinds = [b["kind"] for b in born]
    series = {k: f'jaxmon_training_badput_seconds_total{{workload="born", kind="{k}"}}' for k in kinds}
    for kind, selector in series.items():
        wait_until(functools.partial(booked, p, selector), 30, f"{kind} seconds in Prometheus")
    scrapes = stored_scrapes(p, target)
    # Born inside a render: a scrape Prometheus stored (so it was served in time) began before the block opened and
    # ended after a poll had the series with its seconds.
    inside = [
        b["kind"]
        for b in born
        if b["seen"] is not None and any(start <= b["opened"] and b["left"] <= end for start, end in scrapes)
    ]
    assert inside, (born, scrapes)
    for b in born:
        values = raw(p, series[b["kind"]])
        assert values[0] == 0.0, (b, values)  # Prometheus saw it born
        assert counted(values) == values[-1], (b, values)
        assert 0.03 <= values[-1] <= b["seconds"], (b, values)  # the block: its 30 ms sleep, within the loop's timing
