"""JAX's private names that jaxmon relies on (jaxmon/sources/local/private.py), each hidden in turn by renaming
jaxmon's own lookup of it (JAX is untouched): discovery falls back to the public listing, a tracked function gets
no cost analysis and compiles nothing on the training thread, a program's devices come from its executable,
traces fail as samples; each missing name is counted and logged once, and nothing crashes."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from structlog.testing import capture_logs

import jaxmon
from jaxmon import training
from jaxmon.sources.local import LocalSource, private
from jaxmon.sources.local.profiler import JaxProfiler
from jaxmon.sources.local.training import JaxTraining
from jaxmon.sources.local.workload import CompileCounters
from jaxmon.training.tracker import Tracker, TrackerConfig
from tests.helpers import wait_until


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no name missing (the count is per process)."""
    monkeypatch.setattr(private, "_missing", {})


@pytest.fixture(scope="module")
def source() -> LocalSource:
    return LocalSource(sidecar_defaults=False)


def said(logs: Sequence[MutableMapping[str, Any]], name: str) -> int:
    return sum(1 for e in logs if e["event"].startswith("a private JAX name") and e["name"] == name)


def test_with_every_name_present_nothing_is_missing() -> None:
    devices, _ = LocalSource(sidecar_defaults=False).discover()
    assert len([d for d in devices if d.platform == "cpu"]) == 8
    assert private.missing() == {}


def test_discovery_without_xla_bridge_backends_finds_the_same_devices_through_the_public_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, statuses = LocalSource(sidecar_defaults=False).discover()  # a source lists each device once
    monkeypatch.setattr(private, "BACKENDS", "backends_renamed")
    with capture_logs() as logs:
        for _ in range(2):
            after, fallback = LocalSource(sidecar_defaults=False).discover()
            assert after == before
            assert [(s.name, s.up) for s in fallback] == [(s.name, s.up) for s in statuses if s.up]
    name = "jax._src.xla_bridge.backends_renamed"
    assert private.missing() == {name: 2} and said(logs, name) == 1


def test_discovery_without_the_backend_errors_reports_the_backends_that_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, _ = LocalSource(sidecar_defaults=False).discover()
    monkeypatch.setattr(private, "BACKEND_ERRORS", "_errors_renamed")
    with capture_logs() as logs:
        after, statuses = LocalSource(sidecar_defaults=False).discover()
    assert after == before and all(s.up for s in statuses)
    assert private.missing() == {"jax._src.xla_bridge._errors_renamed": 1} and len(logs) == 1


def test_a_forked_child_knows_the_backends_its_parent_started_and_without_their_cache_cannot_tell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    LocalSource(sidecar_defaults=False).discover()  # JAX's backends started in this process
    monkeypatch.setattr(private, "_lock", private._lock)  # the fork handler replaces these: restored after the test
    monkeypatch.setattr(private, "_forked", False)
    monkeypatch.setattr(private, "_inherited", [])
    assert not private.forked_backends()  # no forked child
    private._after_fork_in_child()  # what os.fork() runs in a child (a unit test forks nothing): these are inherited
    assert private.forked_backends()
    monkeypatch.setattr(private, "_inherited", [object()])  # other backends at the fork: this process's are its own
    assert not private.forked_backends()
    private._after_fork_in_child()
    monkeypatch.setattr(private, "BACKEND_CACHE", "_backends_renamed")
    with capture_logs() as logs:
        assert not private.forked_backends() and not private.forked_backends()
    name = "jax._src.xla_bridge._backends_renamed"
    assert private.missing() == {name: 2} and said(logs, name) == 1


def test_a_failed_platform_the_user_asked_for_is_reported_by_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    class Jax:
        """Stands for jax where the public call is all there is: CPU devices, and a TPU platform that fails."""

        @staticmethod
        def local_devices(backend: str) -> list[Any]:
            if backend == "cpu":
                return list(jax.local_devices(backend="cpu"))
            raise RuntimeError(f"Unable to initialize backend '{backend}': no such platform here")

    monkeypatch.setattr(private, "BACKENDS", "backends_renamed")
    found, errors = private.backends(Jax(), {"cpu", "tpu"})
    assert list(found) == ["cpu"] and len(found["cpu"].local_devices()) == 8
    assert list(errors) == ["tpu"] and "Unable to initialize backend 'tpu'" in errors["tpu"]


def test_without_committed_a_tracked_function_gets_no_cost_and_no_compilation_of_jaxmons(
    source: LocalSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lowering jaxmon reads a cost from must be the call's own program (a cache hit): without `_committed` it
    cannot be, so the program goes without a cost (counted `cost`), and the loop compiles only its own program."""
    monkeypatch.setattr(private, "COMMITTED", "_committed_renamed")
    tracker = Tracker(JaxTraining(source), TrackerConfig(peak_flops=1e12))
    monkeypatch.setattr(training, "_tracker", tracker)
    counters = CompileCounters.installed()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, PartitionSpec("d")))  # type: ignore[no-untyped-call]
    step = jaxmon.track(jax.jit(lambda v: jnp.tanh(v @ v.T) / 64))
    before = counters.as_dict()["compilations"]
    try:
        with capture_logs() as logs:
            for n in range(3):
                x = step(x)
                jaxmon.step(n, x)
            wait_until(lambda: (r := tracker.reading()) is not None and r.steps_total >= 3, what="3 steps seen")
        reading = tracker.reading()
    finally:
        tracker.stop(10)
    assert reading is not None and reading.problems.get("cost") == 1
    assert all(d.hardware_flops_total is None for d in reading.devices)
    assert counters.as_dict()["compilations"] - before == 1  # the loop's own program, and nothing of jaxmon's
    assert said(logs, "jax.Array._committed_renamed") == 1


def test_without_committed_the_signature_keeps_the_sharding_and_plain_leaves_are_no_arrays(
    source: LocalSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = JaxTraining(source)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    placed = jax.device_put(jnp.ones((8,)), NamedSharding(mesh, PartitionSpec("d")))  # type: ignore[no-untyped-call]
    plain = np.ones((8,))
    with_name = ops.signature((placed, plain), {})
    monkeypatch.setattr(private, "COMMITTED", "_committed_renamed")
    without = ops.signature((placed, plain), {})
    assert without == with_name  # a committed array's key keeps its sharding either way; NumPy's has none
    assert private.missing() == {"jax.Array._committed_renamed": 1}  # the NumPy leaf is not counted
    uncommitted = jnp.ones((8,))
    key: Any = ops.signature((uncommitted,), {})
    assert key[1][0][4] is not None  # not known: the sharding is kept (a finer key)
    with pytest.raises(private.PrivateApiMissing, match="_committed_renamed"):
        ops.avals((uncommitted,), {})


def test_without_device_assignment_a_programs_devices_come_from_its_executable(
    source: LocalSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = JaxTraining(source)
    x = jax.device_put(jnp.ones((8,)), jax.devices()[3])
    fn = jax.jit(lambda v: v * 2)
    fn(x)
    known = ops.compiled(fn, ops.avals((x,), {}))
    monkeypatch.setattr(private, "DEVICE_ASSIGNMENT", "_device_assignment_renamed")
    fallback = ops.compiled(fn, ops.avals((x,), {}))
    assert known.assignment == fallback.assignment == (3,)
    assert private.missing() == {"Sharding._device_assignment_renamed": 2}  # input and output shardings


@pytest.fixture
def profiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[JaxProfiler]:
    monkeypatch.setattr(private, "PROFILE_STATE", "_profile_state_renamed")
    yield JaxProfiler(jax)


def test_without_the_profilers_state_a_trace_fails_and_the_users_profiler_is_untouched(
    profiler: JaxProfiler,
) -> None:
    from jax._src import profiler as jax_profiler

    lock = jax_profiler._profile_state.lock
    with capture_logs() as logs:
        for _ in range(2):
            with pytest.raises(private.PrivateApiMissing, match="_profile_state_renamed"):
                profiler.start(python=False)
    assert jax_profiler._profile_state.lock is lock  # not wrapped
    assert private.missing() == {"jax._src.profiler._profile_state_renamed": 2} and len(logs) == 1
