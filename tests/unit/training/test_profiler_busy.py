"""jaxmon's trace sessions beside the user's own `jax.profiler` traces, on real JAX CPU devices: the user's trace
always gets its whole profile, and jaxmon says `Busy` (jaxmon.sources.local.profiler)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxmon.sources.local.profiler import JaxProfiler
from jaxmon.training.sampler import Busy
from jaxmon.xla.profile import read

MODULE = "jit_busy_step"


@pytest.fixture(scope="module")
def step() -> tuple[jax.stages.Wrapped, jax.Array, jax.Array]:
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    w = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, PartitionSpec()))  # type: ignore[no-untyped-call]
    x = jax.device_put(jnp.ones((32, 256)), NamedSharding(mesh, PartitionSpec("data")))  # type: ignore[no-untyped-call]

    def busy_step(w: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = w - 1e-6 * jax.grad(lambda w: jnp.sum(x @ w))(w)
        return out

    f = jax.jit(busy_step)
    f(w, x).block_until_ready()  # compiled outside any trace
    return f, w, x


def run(step: tuple[jax.stages.Wrapped, jax.Array, jax.Array], n: int) -> None:
    f, w, x = step
    for _ in range(n):
        w = f(w, x)
        w.block_until_ready()


def runs_of(directory: Path) -> set[int]:
    """The run ids of MODULE's executions in the one profile under `directory`, read by jaxlib's own parser."""
    (path,) = directory.glob("plugins/profile/*/*.xplane.pb")
    data = jax.profiler.ProfileData.from_file(str(path))
    runs: set[int] = set()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if stats.get("hlo_module") == MODULE:
                    runs.add(int(stats["run_id"]))
    return runs


def test_jaxmon_takes_no_trace_while_the_user_profiles(step, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profiler = JaxProfiler(jax)
    jax.profiler.start_trace(str(tmp_path))
    try:
        run(step, 2)
        with pytest.raises(Busy):
            profiler.start(python=False)
        run(step, 2)
    finally:
        jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
    assert len(runs_of(tmp_path)) == 4  # every step of the user's trace, the one around jaxmon's attempt too


def test_the_users_trace_ends_jaxmons_and_gets_its_whole_profile(step, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profiler = JaxProfiler(jax)
    profiler.start(python=False)
    run(step, 1)
    with jax.profiler.trace(str(tmp_path)):  # would raise, or lose its profile, if jaxmon's session stayed
        run(step, 3)
    assert len(runs_of(tmp_path)) == 3
    with pytest.raises(Busy):
        profiler.stop()
    # And jaxmon traces again once the user's trace is over.
    profiler.start(python=False)
    run(step, 2)
    trace = read(profiler.stop())
    assert MODULE in trace.modules
    assert sorted(trace.devices) == [("cpu", i) for i in range(8)]


def test_a_sample_needs_no_jax_profiler_state_the_user_sees(step, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """While jaxmon traces, jax.profiler says nothing runs, and the user's start_trace / stop_trace just work."""
    from jax._src import profiler as jax_profiler

    profiler = JaxProfiler(jax)
    profiler.start(python=False)
    assert jax_profiler._profile_state.profile_session is None
    jax.profiler.start_trace(str(tmp_path))
    run(step, 2)
    jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
    assert len(runs_of(tmp_path)) == 2
