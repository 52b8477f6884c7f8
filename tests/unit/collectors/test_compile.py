"""The compile collector in-process on real JAX CPU devices: where it runs, and a compilation in this process
counted and rendered with the workload's labels.

Compile counters of real workload processes (embedded, and through the spool) are tests/e2e/test_workloads.py.
"""

from __future__ import annotations

import itertools

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.births import SCRAPES
from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.compile import CompileCollector, CompileOptions, CompileState
from jaxmon.snapshot import Snapshot
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.workload import CompileCounters, InProcessWorkload
from tests.conftest import Samples, parse_samples, sample

# Each collector its own workload name: the births of a workload process's counters are the process's
# (jaxmon.births.for_process), and another test's collector may have had them served already.
_names = itertools.count()


class _Families(PromCollector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def render(collector: CompileCollector, state: CompileState) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(collector.families(Snapshot(), state))))
    return parse_samples(generate_latest(registry).decode())


def workload_collector() -> CompileCollector:
    """The collector as jaxmon.start() builds it inside a training process: its own JAX, its compile events."""
    source = LocalSource(sidecar_defaults=False)
    ctx = standalone_context(source, workload=f"trainer-{next(_names)}", in_process=InProcessWorkload(source))
    return CompileCollector(CompileOptions(), ctx)


def labels(collector: CompileCollector) -> dict[str, str]:
    return {"workload": collector.ctx.workload or "", "process_index": "0"}


def test_it_runs_only_inside_a_workload_process() -> None:
    source = LocalSource(sidecar_defaults=False)
    sidecar = standalone_context(source)  # jaxmon serve: no workload of its own
    assert CompileCollector.unavailable(CompileOptions(), sidecar) == "not inside a workload process"
    embedded = standalone_context(source, workload="trainer", in_process=InProcessWorkload(source))
    assert CompileCollector.unavailable(CompileOptions(), embedded) is None


def test_a_new_program_compiled_here_is_one_more_compilation_with_its_time() -> None:
    import jax

    collector = workload_collector()
    assert set(collector.update().state.counters.values()) == {0}  # born at 0 (jaxmon.births)...
    assert set(collector.update().state.counters.values()) == {0}
    SCRAPES.serve_one()  # ... and counting once a Prometheus scrape has been served them
    before = collector.update().state
    # A program this process has never compiled (a fresh lambda): exactly one backend compilation.
    jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(7, dtype=np.float32)).block_until_ready()
    after = collector.update().state
    assert after.process_index == 0
    assert after.counters["compilations"] == before.counters["compilations"] + 1
    assert after.counters["compile_seconds"] > before.counters["compile_seconds"]
    s = render(collector, after)
    assert sample(s, "jaxmon_jit_compilations_total", **labels(collector)) == after.counters["compilations"]
    assert sample(s, "jaxmon_jit_compile_seconds_total", **labels(collector)) == after.counters["compile_seconds"]
    assert sample(s, "jaxmon_compilation_cache_hits_total", **labels(collector)) == after.counters["cache_hits"]
    assert sample(s, "jaxmon_compilation_cache_misses_total", **labels(collector)) == after.counters["cache_misses"]
    # Running the compiled program again compiles nothing.
    jax.jit(abs)(np.arange(3)).block_until_ready()
    counted = collector.update().state.counters["compilations"]
    jax.jit(abs)(np.arange(3)).block_until_ready()
    assert collector.update().state.counters["compilations"] == counted


# JAX's events of one compilation (jax/_src/compiler.py compile_or_get_cached, wrapped by pxla's
# backend_compile_duration): a request when the persistent cache is on, a hit when it had the program, the end.
REQUEST = ("event", CompileCounters.CACHE_REQUEST_EVENT)
HIT = ("event", CompileCounters.CACHE_HIT_EVENT)
WRITTEN = ("event", "/jax/compilation_cache/cache_misses")  # JAX's: an entry written (thresholds passed)
END = ("duration", CompileCounters.COMPILE_EVENT)


def replay(counters: CompileCounters, *events: tuple[str, str]) -> dict[str, float]:
    for kind, name in events:
        if kind == "event":
            counters._on_event(name)
        else:
            counters._on_duration(name, 0.5, fun_name="f")
    return counters.as_dict()


def test_a_miss_is_a_compilation_that_asked_the_cache_and_found_nothing_written_or_not() -> None:
    c = CompileCounters()
    # Missed and written, missed and not written (under the thresholds), found: two misses, one hit.
    first = {"compilations": 1, "compile_seconds": 0.5, "cache_hits": 0, "cache_misses": 1}
    assert replay(c, REQUEST, END, WRITTEN) == first
    assert replay(c, REQUEST, END)["cache_misses"] == 2
    counts = replay(c, REQUEST, HIT, END)
    assert (counts["cache_misses"], counts["cache_hits"], counts["compilations"]) == (2, 1, 3)
    # Without the persistent cache JAX asks nothing: a compilation is neither.
    counts = replay(c, END)
    assert (counts["cache_misses"], counts["cache_hits"], counts["compilations"]) == (2, 1, 4)


def test_a_lookup_in_progress_is_not_a_miss_and_the_count_never_goes_down() -> None:
    c = CompileCounters()
    assert replay(c, REQUEST)["cache_misses"] == 0  # still looking: it may yet be a hit
    assert replay(c, HIT)["cache_misses"] == 0
    assert replay(c, END)["cache_misses"] == 0
    # A request whose compilation recorded no end is booked as a miss at the next request of that thread.
    replay(c, REQUEST)
    assert replay(c, REQUEST, END)["cache_misses"] == 2


def test_each_thread_has_its_own_lookup() -> None:
    import threading

    c = CompileCounters()
    replay(c, REQUEST)  # this thread is looking
    other = threading.Thread(target=replay, args=(c, REQUEST, HIT, END))
    other.start()
    other.join()
    assert c.as_dict()["cache_hits"] == 1 and c.as_dict()["cache_misses"] == 0
    assert replay(c, END)["cache_misses"] == 1
