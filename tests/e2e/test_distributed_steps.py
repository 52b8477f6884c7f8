"""Step tracking in every process of a real jax.distributed job (tests/workloads/job.py, two processes on CPU,
gloo collectives on loopback): each process's steps return arrays that span both processes' devices (not fully
addressable), and each process's jaxmon must see its steps complete, not only process 0's. A process whose host
sleeps before each step keeps its devices idle that long: its host wait shows it.

The waiter once held such arrays with `clone()`, which copies to every device of the sharding and fails on every
process but the one holding the first device: every step of processes 1.. was counted as `unready` (its completion
unknown), and their host wait stayed at zero whatever their hosts did (JaxmonTrainingStraggler could not name them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT
from tests.helpers import Child, Samples, free_port, parse_samples, wait_until

JOB = ROOT / "tests" / "workloads" / "job.py"
PROCESSES = 2
DELAY_MS = 100


def totals(child: Child) -> dict[str, float]:
    """The process's step telemetry: steps, steps booked with a known completion (the step histogram's count),
    host wait, and its tracking problems by reason."""
    samples: Samples = parse_samples(requests.get(child.hello["url"] + "/metrics", timeout=10).text)
    out: dict[str, float] = {}
    for (name, labels), value in samples.items():
        key = {
            "jaxmon_training_steps_total": "steps",
            "jaxmon_training_step_duration_seconds_count": "booked",
            "jaxmon_training_host_wait_seconds_total": "host_wait",
        }.get(name)
        if name == "jaxmon_training_tracking_problems_total":
            key = "problem." + dict(labels)["reason"]
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Child]]:
    tmp: Path = tmp_path_factory.mktemp("distributed")
    coordinator = f"127.0.0.1:{free_port()}"
    children: list[Child] = []
    try:
        for index in range(PROCESSES):
            args = ["--coordinator", coordinator, "--processes", str(PROCESSES), "--process-id", str(index)]
            children.append(Child(tmp, *args, "--workload", "pair", "--size", "128", script=JOB, hello=False))
        assert [c.greet(120)["process_index"] for c in children] == list(range(PROCESSES))
        yield children
    finally:
        for child in children:
            child.close()


def test_every_process_sees_its_steps_complete(job: list[Child]) -> None:
    for child in job:

        def booked(c: Child = child) -> bool:
            return totals(c).get("booked", 0) >= 20

        def detail(c: Child = child) -> str:
            return f"{totals(c)}\n{c.log()[-3000:]}"

        wait_until(booked, 90, "20 steps booked", step=0.2, detail=detail)
    for index, child in enumerate(job):
        seen = totals(child)
        problems = {k: v for k, v in seen.items() if k.startswith("problem.") and v}
        assert problems == {}, (index, seen)
        # One step in flight: all but the ones not yet seen complete are booked with their durations.
        assert seen["booked"] >= seen["steps"] - 2, (index, seen)


def test_a_delayed_process_shows_its_host_wait(job: list[Child]) -> None:
    """Process 1 (not the one holding the first device) sleeps before each step, once its step in flight is
    complete: its devices idle for the whole sleep, and its host wait grows by most of the delay per step."""
    dispatched = job[1].send(f"delay {DELAY_MS}")["dispatched"]
    # The exposition is a poll behind, and the waiter's looks up to 500 ms (hundreds of undelayed steps at this
    # size): count from the first reading that shows step `dispatched` + 2 booked (steps 0.. of it: + 3), the first
    # one surely delayed. (A rise of the host wait by half the delay read as that step: a loaded machine's
    # undelayed steps gave it, and the 20 steps after it were mostly undelayed: CI once read 7 ms a step.)
    wait_until(lambda: totals(job[1])["steps"] >= dispatched + 3, 60, "process 1's first delayed step", step=0.2,
               detail=lambda: f"{dispatched} {totals(job[1])}")  # fmt: skip
    start = totals(job[1])
    wait_until(lambda: totals(job[1])["booked"] >= start["booked"] + 20, 90, "20 delayed steps booked", step=0.2)
    after = totals(job[1])
    steps = after["booked"] - start["booked"]
    waited = after["host_wait"] - start["host_wait"]
    # At least a quarter of the delay per step, leaving room for a loaded machine's slow compute and collective.
    assert waited >= 0.25 * DELAY_MS / 1000 * steps, (waited, steps, start, after)
    job[1].send("delay 0")
