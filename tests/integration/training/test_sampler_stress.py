"""A stress test of sampled traces beside the user's own profiling, on real JAX CPU devices, under faulthandler: a
loop of hundreds of steps samples every few steps while the user starts and stops `jax.profiler` traces at random
moments (often in the middle of jaxmon's). Nothing crashes or raises into the loop, every trace of the user's holds
every step it covered, and every sample is accounted for."""

from __future__ import annotations

import faulthandler
import random
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.handed import SamplerConfig
from jaxmon.training.sampler import LEAD, Sampler
from jaxmon.training.tracker import Tracker, TrackerConfig
from tests.helpers import wait_until

EVERY = 5
TRACED = 2  # steps per sample
# The loop asks for no block it does not finish: a block is asked for when step n0 - LEAD is handed and ends with
# step n0 + TRACED - 1, so with an n0 in [STEPS - TRACED + 1, STEPS - 1 + LEAD] a multiple of EVERY, the last sample
# would wait for steps that never come until the sampler's own timeout (MIN_TIMEOUT, as long as this test's wait).
STEPS = 302
MODULE = "jit_stress_step"


def runs_of(directory: Path) -> int:
    (path,) = directory.glob("plugins/profile/*/*.xplane.pb")
    runs: set[int] = set()
    for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if stats.get("hlo_module") == MODULE:
                    runs.add(int(stats["run_id"]))
    return len(runs)


def test_samples_and_the_users_traces_at_random_moments(tmp_path: Path) -> None:
    assert all((n0 % EVERY) != 0 for n0 in range(STEPS - TRACED + 1, STEPS + LEAD)), (
        "a last block the loop does not finish"
    )
    faulthandler.enable()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    w = jax.device_put(jnp.ones((256, 256)) / 256, NamedSharding(mesh, PartitionSpec()))  # type: ignore[no-untyped-call]
    x = jax.device_put(jnp.ones((32, 256)), NamedSharding(mesh, PartitionSpec("data")))  # type: ignore[no-untyped-call]

    def stress_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 1e-3 * g, loss

    step = jax.jit(stress_step)
    w, loss = step(w, x)
    loss.block_until_ready()
    tracker = Tracker(
        JaxTraining(LocalSource(sidecar_defaults=False)), TrackerConfig(profile=SamplerConfig(EVERY, TRACED))
    )
    rng = random.Random(34)
    user: list[tuple[Path, int]] = []  # each trace of the user's and the steps it covered
    tracing: Path | None = None
    covered = 0
    try:
        for n in range(STEPS):
            if tracing is None and rng.random() < 0.08:
                tracing = tmp_path / f"user-{n}"
                jax.profiler.start_trace(str(tracing))
                covered = 0
            w, loss = step(w, x)
            tracker.step(n, loss)
            loss.block_until_ready()
            covered += 1
            if tracing is not None and rng.random() < 0.3:
                jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
                user.append((tracing, covered))
                tracing = None
        if tracing is not None:
            jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
            user.append((tracing, covered))
        sampler = tracker.sampler
        assert isinstance(sampler, Sampler)
        wait_until(lambda: sampler._block is None and sampler._request is None, 60, "the last sample over")
        reading = sampler.reading()
    finally:
        tracker.stop(10)
    assert reading is not None
    results = reading.results
    assert len(user) >= 5 and results["busy"] >= 1 and results["taken"] >= 1, (len(user), results)
    # Every block whose trace was asked for is accounted for once (a block asked for while a sample still ran is
    # skipped, never half-counted).
    assert sum(results.values()) <= STEPS // EVERY
    for directory, steps in user:
        assert runs_of(directory) == steps, directory
    for device in reading.devices:
        assert sum(device.parts.values()) == pytest.approx(device.profiled_seconds_total, rel=1e-9)
        assert device.profiled_seconds_total > 0
