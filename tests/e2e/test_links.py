"""Which link carries each mesh axis, in a real jax.distributed job (tests/workloads/links_job.py: 2 processes x 4 CPU
devices, gloo collectives over loopback) with a mesh (("proc", 2), ("local", 4)) and a psum over each axis.

The truth: the shapes (each call moves its block's bytes per device over each axis), and which process holds each
device (CPU devices of one process are `local`, of two processes `network`). The same axes over the same devices
transposed swap the links. The sampled traces attribute each collective event to its instruction's axes and link:
their exposed times per place sum to the traces' exposed collective time (one collective at a time per device), and
their bytes are the traced events times the shapes' bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT
from tests.helpers import Child, Samples, free_port, parse_samples, wait_until

JOB = ROOT / "tests" / "workloads" / "links_job.py"
STEPS = 20  # two sampled blocks of 2 steps each (every 10 steps)
BYTES = "jaxmon_training_collective_bytes_total"
Bytes = dict[tuple[str, str, str, str], float]


def scrape(child: Child) -> Samples:
    return parse_samples(requests.get(child.hello["url"] + "/metrics", timeout=10).text)


def by_place(s: Samples, name: str) -> dict[tuple[str, str, str, str], float]:
    """(device, op, axes, link) -> value of family `name`."""
    return {
        (labels["device"], labels["op"], labels["axes"], labels["link"]): value
        for (family, key), value in s.items()
        if family == name and (labels := dict(key))["workload"] == "links"
    }


def total(s: Samples, name: str, **want: str) -> float:
    return sum(v for (family, key), v in s.items() if family == name and want.items() <= dict(key).items())


PLACES = {
    "normal": {("proc", "network"), ("local", "local")},
    "swapped": {("proc", "local"), ("local", "network")},
}


def placed_bytes(child: Child, mesh: str) -> dict[tuple[str, str, str, str], float]:
    """(device, op, axes, link) -> collective bytes of `mesh`'s places."""
    return {k: v for k, v in by_place(scrape(child), BYTES).items() if k[2:] in PLACES[mesh]}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Child]]:
    """The job, each mesh's program called once and analysed (the sampled traces then place every event): both
    programs are named `jit_body` and name their instructions alike, with other groups."""
    tmp: Path = tmp_path_factory.mktemp("links")
    coordinator = f"127.0.0.1:{free_port()}"
    children: list[Child] = []
    try:
        for index in range(2):
            args = ("--coordinator", coordinator, "--process-id", str(index))
            children.append(Child(tmp, *args, script=JOB, hello=False, env={"JAX_NUM_CPU_DEVICES": "4"}))
        assert [c.greet(120)["process_index"] for c in children] == [0, 1]
        # Calls made before a program's analysis are added at the next step booked after it: a step of the swapped
        # mesh at a time until both programs' calls are all counted (before step 8, which starts the first sample).
        # The swapped mesh's program is analysed last: a trace event placed by its instruction's name alone would
        # take its place.
        calls = {"normal": run(children, "normal", 1)}
        for _ in range(6):
            calls["swapped"] = run(children, "swapped", 1) - calls["normal"]
            if all(counted(c, calls, 20) for c in children):
                break
        else:
            raise AssertionError(f"both programs' calls not counted: {[by_place(scrape(c), BYTES) for c in children]}")
        yield children
    finally:
        for child in children:
            child.close()


def counted(child: Child, calls: dict[str, int], timeout: float) -> bool:
    """Within `timeout` s, each mesh's bytes are its calls' (every call counts, those before the analysis too)."""
    sizes = child.hello["sizes"]
    want = {
        (str(dev), "all-reduce", axes, link): float(n * sizes[axes])
        for mesh, n in calls.items()
        for dev in child.hello["devices"]
        for axes, link in PLACES[mesh]
    }
    deadline = time.monotonic() + timeout
    while by_place(scrape(child), BYTES) != want:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def run(job: list[Child], mesh: str, steps: int) -> int:
    """Both processes run `steps` steps of `mesh` (written to both before reading: each step waits for both)."""
    for child in job:
        assert child.proc.stdin is not None
        child.proc.stdin.write(f"run {mesh} {steps}\n")
        child.proc.stdin.flush()
    handed = {int(child.read_ok(120)["steps"]) for child in job}
    assert len(handed) == 1
    return handed.pop()


def booked(child: Child, steps: int) -> Samples:
    def seen() -> bool:
        return total(scrape(child), "jaxmon_training_steps_total") >= steps

    wait_until(seen, 60, f"{steps} steps booked", step=0.2, detail=lambda: child.log()[-3000:])
    return scrape(child)


def test_each_axis_bytes_carry_its_link_and_swapping_the_axes_swaps_the_links(job: list[Child]) -> None:
    sizes = job[0].hello["sizes"]
    for mesh in ("normal", "swapped"):
        before = [placed_bytes(c, mesh) for c in job]
        run(job, mesh, STEPS)
        for child, was in zip(job, before, strict=True):
            devices = [str(d) for d in child.hello["devices"]]
            # normal: "proc" crosses the processes (network), "local" stays in one; swapped: the other way round
            want = {
                (dev, "all-reduce", axes, link): STEPS * sizes[axes] for dev in devices for axes, link in PLACES[mesh]
            }

            def exact(c: Child = child, m: str = mesh, w: Bytes = was, x: Bytes = want) -> bool:
                return added(c, m, w) == x

            def now(c: Child = child, m: str = mesh, w: Bytes = was) -> str:
                return str(added(c, m, w))

            wait_until(exact, 60, f"the {mesh} mesh's bytes by axis and link", step=0.2, detail=now)
    for child in job:
        problems = {k: v for k, v in scrape(child).items() if k[0] == "jaxmon_training_tracking_problems_total"}
        assert not any(dict(k[1])["reason"].startswith("link_") for k in problems), problems


def added(
    child: Child, mesh: str, before: dict[tuple[str, str, str, str], float]
) -> dict[tuple[str, str, str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in placed_bytes(child, mesh).items()}


def test_the_sampled_traces_split_the_collective_time_by_axis_and_link(job: list[Child]) -> None:
    """The normal mesh's steps after the swapped mesh's program was analysed: its events are placed by their own
    program (the same instruction names in both), so its sampled bytes grow on the normal mesh's places."""
    sizes = job[0].hello["sizes"]
    name = "jaxmon_training_profile_collective_bytes_total"
    before = by_place(scrape(job[0]), name)
    booked(job[0], run(job, "normal", STEPS))

    def sampled() -> dict[tuple[str, str, str, str], float]:
        """Events of the normal mesh's places sampled since `before`, per device and place."""
        return {
            k: (v - before.get(k, 0.0)) / sizes[k[2]]
            for k, v in by_place(scrape(job[0]), name).items()
            if k[2:] in PLACES["normal"]
        }

    def one_block() -> bool:
        # a sampled block of 2 steps, each with one psum per axis, on every device and place of the normal mesh
        got = sampled()
        devices = {str(d) for d in job[0].hello["devices"]}
        return {k[0] for k, n in got.items() if n >= 2} == devices and all(
            sum(1 for k, n in got.items() if k[0] == d and n >= 2) == 2 for d in devices
        )

    wait_until(one_block, 120, "a sampled block of the normal mesh's steps placed on its axes' links", step=0.2,
               detail=lambda: str(sampled()))  # fmt: skip
    s = scrape(job[0])
    taken = total(s, "jaxmon_training_profiles_total", result="taken")
    assert taken >= 1, s
    for device in (str(d) for d in job[0].hello["devices"]):
        exposed = {
            k[2:]: v for k, v in by_place(s, "jaxmon_training_profile_exposed_collective_seconds_total").items()
            if k[0] == device
        }  # fmt: skip
        # every sampled event placed (both programs were analysed before the first sample)
        assert set(exposed) <= PLACES["normal"] | PLACES["swapped"], exposed
        part = total(s, "jaxmon_training_profile_seconds_total", device=device, part="collective")
        assert part > 0, s
        # one collective at a time on a device: the per-place exposed times are the exposed collective time
        assert sum(exposed.values()) == pytest.approx(part, rel=1e-6), (exposed, part)
        moved = {k[2:]: v for k, v in by_place(s, name).items() if k[0] == device}
        # each traced step ran one psum per axis: the bytes are whole multiples of the shapes' bytes
        events = {place: n / sizes[place[0]] for place, n in moved.items()}
        assert all(n >= 1 and n == int(n) for n in events.values()), events
    problems = {dict(k[1])["reason"] for k in s if k[0] == "jaxmon_training_tracking_problems_total"}
    assert not any(reason.startswith("trace_") for reason in problems), problems
