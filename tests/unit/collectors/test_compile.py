"""The compile collector in-process on real JAX CPU devices: where it runs, and a compilation in this process
counted and rendered with the workload's labels.

Compile counters of real workload processes (embedded, and through the spool) are tests/e2e/test_workloads.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.compile import CompileCollector, CompileOptions, CompileState
from jaxmon.snapshot import Snapshot
from jaxmon.sources.local import InProcessWorkload, LocalSource
from tests.conftest import Samples, parse_samples, sample

LABELS = {"workload": "trainer", "process_index": "0"}


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
    ctx = standalone_context(source, workload="trainer", in_process=InProcessWorkload(source))
    return CompileCollector(CompileOptions(), ctx)


def test_it_runs_only_inside_a_workload_process() -> None:
    source = LocalSource(sidecar_defaults=False)
    sidecar = standalone_context(source)  # jaxmon serve: no workload of its own
    assert CompileCollector.unavailable(CompileOptions(), sidecar) == "not inside a workload process"
    embedded = standalone_context(source, workload="trainer", in_process=InProcessWorkload(source))
    assert CompileCollector.unavailable(CompileOptions(), embedded) is None


def test_a_new_program_compiled_here_is_one_more_compilation_with_its_time() -> None:
    import jax

    collector = workload_collector()
    before = collector.update().state
    # A program this process has never compiled (a fresh lambda): exactly one backend compilation.
    jax.jit(lambda x: x * 3.0 + 1.0)(np.arange(7, dtype=np.float32)).block_until_ready()
    after = collector.update().state
    assert after.process_index == 0
    assert after.counters["compilations"] == before.counters["compilations"] + 1
    assert after.counters["compile_seconds"] > before.counters["compile_seconds"]
    s = render(collector, after)
    assert sample(s, "jaxmon_jit_compilations_total", **LABELS) == after.counters["compilations"]
    assert sample(s, "jaxmon_jit_compile_seconds_total", **LABELS) == after.counters["compile_seconds"]
    assert sample(s, "jaxmon_compilation_cache_hits_total", **LABELS) == after.counters["cache_hits"]
    assert sample(s, "jaxmon_compilation_cache_misses_total", **LABELS) == after.counters["cache_misses"]
    # Running the compiled program again compiles nothing.
    jax.jit(abs)(np.arange(3)).block_until_ready()
    counted = collector.update().state.counters["compilations"]
    jax.jit(abs)(np.arange(3)).block_until_ready()
    assert collector.update().state.counters["compilations"] == counted
