"""The optimizer programs of optax and of a Flax NNX model on a ("data", "model") mesh of 8 CPU devices (issue 49):
their HLO spells the global norm's groups as a mesh whose device ids are a transposed iota
(`device_ids=([2,4]T(1,0))`), which jaxmon read as an error, losing the program's collective bytes and its
predicted peak. Each program is compiled here; its collectives are read with no error, each one's groups equal the
groups XLA itself prints for it, and their bytes per mesh axis equal what the shapes give
(tests/workloads/optimizer_model.py). Then a real 2-process job trains the Flax model (tests/workloads/optimizer_job.py,
"data" across the processes, "model" within each): every call's bytes land on their axes' links, the predicted peak is
the program's own, and the sampled traces place every collective event (none under link "unknown"). flax and optax
are end-to-end-only test libraries (tests/floors.py)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import requests
from jax.sharding import Mesh

from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.xla.hlo import MeshLayout, parse, summarize
from tests.helpers import ROOT, Child, Samples, free_port, parse_samples, per_device, wait_until
from tests.workloads.optimizer_model import expected, flax_step, optax_update

DATA, MODEL = 2, 4
PROGRAMS: dict[str, Callable[[Mesh], tuple[Any, tuple[Any, ...]]]] = {
    "optax": optax_update,
    "flax": flax_step,
}


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    assert jax.device_count() >= 8, "run with JAX_NUM_CPU_DEVICES=8"
    return Mesh(np.array(jax.devices()[:8]).reshape(DATA, MODEL), ("data", "model"))


@pytest.fixture(scope="module")
def programs(mesh: Mesh) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """Each program's jitted function and arguments, built once."""
    return {name: build(mesh) for name, build in PROGRAMS.items()}


def layout_of(mesh: Mesh) -> MeshLayout:
    return MeshLayout(tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(d.id for d in mesh.devices.flat))


def by_channel(text: str) -> dict[int, str]:
    """Each collective instruction line of HLO `text` by its channel id (the same in every printing of a module)."""
    return {int(m.group(1)): line for line in text.splitlines() if (m := re.search(r"\bchannel_id=(\d+)", line))}


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_optimizer_programs_collectives_are_read_as_xla_groups_them_and_weigh_what_the_shapes_give(
    mesh: Mesh, programs: dict[str, tuple[Any, tuple[Any, ...]]], program: str
) -> None:
    fn, args = programs[program]
    compiled = fn.lower(*args).compile()
    text = compiled.as_text()
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10):  # jax 0.9 spells the groups as lists
        assert re.search(r"device_ids=\(\[\d+,\d+\]T\(1,0\)\)", text), "the spelling of issue 49 is gone"
    parsed = parse(text)  # raised HloParseError: mesh device ids 'T(1,0)' are not 8 ids
    # The groups as XLA expands them: the module printed with every group listed, each line found by its channel.
    [module] = compiled.runtime_executable().hlo_modules()
    listed = by_channel(module.to_string(_print_options()))
    assert parsed.collectives and len(listed) == len(parsed.collectives)
    lines = by_channel(text)
    for c in parsed.collectives:
        [channel] = [k for k, line in lines.items() if re.match(rf"\s*(ROOT )?%{re.escape(c.name)} =", line)]
        assert c.groups == listed_groups(listed[channel]), (c.name, lines[channel])
    assert summarize(parsed, layout_of(mesh)) == expected(program, DATA, MODEL)


def test_the_predicted_peak_and_the_placed_bytes_of_the_optimizer_step_are_kept(
    mesh: Mesh, programs: dict[str, tuple[Any, tuple[Any, ...]]]
) -> None:
    """What jaxmon exports of the program: its bytes by (op, axes, link) and its predicted peak, which the parse
    error lost."""
    ops = JaxTraining(LocalSource(sidecar_defaults=False))
    fn, args = programs["flax"]
    c = ops.compiled(fn, (args, {}))
    assert c.mesh == layout_of(mesh)
    comm = ops.communication(c)
    want = {(op, ",".join(axes), "local"): float(n) for (op, axes), n in expected("flax", DATA, MODEL).items()}
    assert dict(comm.collective_bytes) == want
    assert comm.peak_memory == c.compiled.memory_analysis().peak_memory_in_bytes > 0


def _print_options() -> Any:
    """XLA's fingerprint print options (jaxlib's HLO bindings: `jaxlib._hlo`, `jaxlib._jax` in jax 0.9), which
    list every collective's groups."""
    for name in ("jaxlib._hlo", "jaxlib._jax"):
        api = importlib.import_module(name)
        if hasattr(api, "HloPrintOptions"):
            return api.HloPrintOptions.fingerprint()
    raise AssertionError("no HloPrintOptions in jaxlib")


def listed_groups(line: str) -> tuple[tuple[int, ...], ...]:
    """The groups of a collective line whose replica_groups are listed (`{{0,1},{2,3}}`)."""
    groups = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
    assert groups is not None, line
    return tuple(tuple(int(i) for i in g.split(",")) for g in re.findall(r"\{([\d,]+)\}", groups.group(1)))


# ------------------------------------------------------------------------------------------ a 2-process job

JOB = ROOT / "tests" / "workloads" / "optimizer_job.py"
STEPS = 22  # two sampled blocks of 2 steps each: steps 10-11 and 20-21 (every 10 steps)
LINKS = {"data": "network", "model": "local"}
PROFILES = "jaxmon_training_profiles_total"  # "data" crosses the two processes, "model" stays in one


def scrape(child: Child) -> Samples:
    return parse_samples(requests.get(child.hello["url"] + "/metrics", timeout=10).text)


def by_place(s: Samples, name: str) -> dict[tuple[str, str, str, str], float]:
    """(device, op, axes, link) -> value of family `name`."""
    return {
        (labels["device"], labels["op"], labels["axes"], labels["link"]): value
        for (family, key), value in s.items()
        if family == name and (labels := dict(key))["workload"] == "optimizer"
    }


def run(job: list[Child], steps: int) -> int:
    """Both processes run `steps` steps (written to both before reading: each step waits for both)."""
    for child in job:
        assert child.proc.stdin is not None
        child.proc.stdin.write(f"run {steps}\n")
        child.proc.stdin.flush()
    handed = {int(child.read_ok(120)["steps"]) for child in job}
    assert len(handed) == 1
    return handed.pop()


def test_a_2_process_jobs_optimizer_collectives_carry_their_links_in_the_bytes_and_the_sampled_traces(
    tmp_path: Path,
) -> None:
    """Every call's bytes on each mesh axis's link, the predicted peak the program's own, and the sampled traces'
    collective events each placed on its instruction's axes and link: none under link "unknown"."""
    coordinator = f"127.0.0.1:{free_port()}"
    job: list[Child] = []
    try:
        for index in range(2):
            args = ("--coordinator", coordinator, "--process-id", str(index))
            job.append(Child(tmp_path, *args, script=JOB, hello=False, env={"JAX_NUM_CPU_DEVICES": "4"}))
        for child in job:
            child.greet(180)
        steps = run(job, STEPS)
        for child in job:
            placed_everywhere(child, steps)
    finally:
        for child in job:
            child.close()


def placed_everywhere(child: Child, steps: int) -> None:
    """One process of the job after `steps` steps: its bytes, its peak and its sampled traces, all placed."""
    per_call = expected("flax", DATA, MODEL)
    devices = [str(d) for d in child.hello["devices"]]
    want = {
        (d, op, ",".join(axes), LINKS[axes[0]]): float(steps * n) for d in devices for (op, axes), n in per_call.items()
    }

    def placed_bytes() -> dict[tuple[str, str, str, str], float]:
        return by_place(scrape(child), "jaxmon_training_collective_bytes_total")

    wait_until(lambda: placed_bytes() == want, 60, "each call's bytes on its links", step=0.2,
               detail=lambda: str(placed_bytes()))  # fmt: skip

    def taken() -> float:
        return sum(v for (n, k), v in scrape(child).items() if n == PROFILES and dict(k)["result"] == "taken")

    wait_until(lambda: taken() == 2, 120, "two sampled blocks", step=0.2, detail=lambda: child.log()[-3000:])
    s = scrape(child)
    peaks = per_device(s, "jaxmon_training_program_peak_memory_bytes")
    assert peaks == dict.fromkeys(devices, float(child.hello["peak"])), peaks
    seconds = by_place(s, "jaxmon_training_profile_collective_seconds_total")
    moved = by_place(s, "jaxmon_training_profile_collective_bytes_total")
    # Every sampled collective event placed (issue 49: the global norm's landed under link="unknown").
    assert {k for k, v in seconds.items() if v > 0} == set(want), seconds
    assert all(link != "unknown" for (_, _, _, link) in seconds), seconds
    # Two blocks of 2 traced steps: each place's bytes are its instructions' events inside the steps' windows (an
    # event cut by a window's edge is not counted), 4 calls' at most.
    for key in want:
        assert 0 < moved[key] <= 4 * per_call[(key[1], tuple(key[2].split(",")))], (key, moved[key])
    problems = {dict(k)["reason"] for (n, k) in s if n == "jaxmon_training_tracking_problems_total"}
    assert not any(r.startswith(("trace_", "link_")) for r in problems), problems
