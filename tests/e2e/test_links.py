"""Which link carries each mesh axis, in a real jax.distributed job (tests/workloads/links_job.py: 2 processes x 4 CPU
devices, gloo collectives over loopback) with a mesh (("proc", 2), ("local", 4)) and a psum over each axis.

The truth: the shapes (each call moves its block's bytes per device over each axis), and which process holds each
device (CPU devices of one process are `local`, of two processes `network`). The same axes over the same devices
transposed swap the links. The sampled traces attribute each collective event to its instruction's axes and link:
their exposed times per place sum to the traces' exposed collective time (one collective at a time per device), and
their bytes are the traced events times the shapes' bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT
from tests.helpers import Child, Samples, free_port, parse_samples, wait_until

JOB = ROOT / "tests" / "workloads" / "links_job.py"
STEPS = 20  # two sampled blocks of 2 steps each (every 10 steps)
BYTES = "jaxmon_training_collective_bytes_total"


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


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Child]]:
    tmp: Path = tmp_path_factory.mktemp("links")
    coordinator = f"127.0.0.1:{free_port()}"
    children: list[Child] = []
    try:
        for index in range(2):
            args = ("--coordinator", coordinator, "--process-id", str(index))
            children.append(Child(tmp, *args, script=JOB, hello=False, env={"JAX_NUM_CPU_DEVICES": "4"}))
        assert [c.greet(120)["process_index"] for c in children] == [0, 1]
        yield children
    finally:
        for child in children:
            child.close()


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
    handed = run(job, "normal", STEPS)
    for child in job:
        devices = [str(d) for d in child.hello["devices"]]

        def exact(c: Child = child, d: list[str] = devices) -> bool:
            # every call counts: the first one, made before the program was analysed, too
            want = {(dev, "all-reduce", "proc", "network"): float(handed * sizes["proc"]) for dev in d} | {
                (dev, "all-reduce", "local", "local"): float(handed * sizes["local"]) for dev in d
            }
            return by_place(scrape(c), BYTES) == want

        def now(c: Child = child) -> str:
            return str(by_place(scrape(c), BYTES))

        wait_until(exact, 60, "the normal mesh's bytes by axis and link", step=0.2, detail=now)
    before = {i: by_place(scrape(c), BYTES) for i, c in enumerate(job)}
    more = run(job, "swapped", STEPS) - handed
    for index, child in enumerate(job):
        devices = [str(d) for d in child.hello["devices"]]

        def swapped(c: Child = child, d: list[str] = devices, i: int = index) -> bool:
            added = {k: v - before[i].get(k, 0.0) for k, v in by_place(scrape(c), BYTES).items()}
            want = {(dev, "all-reduce", "proc", "local"): float(more * sizes["proc"]) for dev in d} | {
                (dev, "all-reduce", "local", "network"): float(more * sizes["local"]) for dev in d
            }
            return {k: v for k, v in added.items() if v} == want

        def then(c: Child = child, i: int = index) -> str:
            return str((before[i], by_place(scrape(c), BYTES)))

        wait_until(swapped, 60, "the swapped mesh's links swap", step=0.2, detail=then)
    for child in job:
        problems = {k: v for k, v in scrape(child).items() if k[0] == "jaxmon_training_tracking_problems_total"}
        assert not any(dict(k[1])["reason"].startswith("link_") for k in problems), problems


def test_the_sampled_traces_split_the_collective_time_by_axis_and_link(job: list[Child]) -> None:
    sizes = job[0].hello["sizes"]
    s = booked(job[0], run(job, "normal", STEPS))
    taken = total(s, "jaxmon_training_profiles_total", result="taken")
    assert taken >= 2, s
    for device in (str(d) for d in job[0].hello["devices"]):
        exposed = {
            k[2:]: v for k, v in by_place(s, "jaxmon_training_profile_exposed_collective_seconds_total").items()
            if k[0] == device
        }  # fmt: skip
        assert set(exposed) <= {("proc", "network"), ("proc", "local"), ("local", "local"), ("local", "network")}
        part = total(s, "jaxmon_training_profile_seconds_total", device=device, part="collective")
        assert part > 0, s
        # one collective at a time on a device: the per-place exposed times are the exposed collective time
        assert sum(exposed.values()) == pytest.approx(part, rel=1e-6), (exposed, part)
        moved = {
            k[2:]: v for k, v in by_place(s, "jaxmon_training_profile_collective_bytes_total").items() if k[0] == device
        }
        # each traced step ran one psum per axis: the bytes are whole multiples of the shapes' bytes
        events = {place: n / sizes[place[0]] for place, n in moved.items()}
        assert all(n >= 1 and n == int(n) for n in events.values()), events
        assert events[("proc", "network")] >= 2 and events[("local", "local")] >= 2, events
