"""The spool collector in-process: a published workload's report turned into its families, and the exposition's
last line of defence against a number that cannot be rendered.

The sidecar daemon reading real spool directories is tests/e2e/test_spool_hardening.py and tests/e2e/test_workloads.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

from jaxmon.births import SCRAPES
from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.memory import MemoryCollector, MemoryOptions, MemoryState
from jaxmon.collectors.spool import SpoolCollector, SpoolOptions, SpoolState
from jaxmon.exposition import Exposition
from jaxmon.snapshot import Snapshot
from jaxmon.sources.replay import ReplaySource
from jaxmon.sources.spool_codec import WorkloadReport
from tests.conftest import FIXTURES, parse_samples, sample

SHAPES = FIXTURES / "shapes.json"


class _Families(PromCollector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from (f for f in self.families if f.samples)


def test_a_value_that_cannot_be_rendered_leaves_out_its_collector_not_the_scrape(tmp_path: Path) -> None:
    # The schema keeps such numbers out of the spool; this checks the last line of defence in the exposition.
    ctx = standalone_context(ReplaySource(FIXTURES / "shapes.json"))
    spool = SpoolCollector(SpoolOptions(dir=tmp_path), ctx)
    memory = MemoryCollector(MemoryOptions(), ctx)
    bad = WorkloadReport("bad", "h", 1, 0, "0", 0.0, 0.0, (), {"compilations": 10**400})
    snap = Snapshot(
        build={"version": "1"},
        states={"spool": SpoolState(workloads=(bad,)), "memory": MemoryState()},
    )
    text = Exposition(lambda: snap, [memory, spool]).render(want_gzip=False).decode()
    s = parse_samples(text)
    assert sample(s, "jaxmon_build_info", version="1", jax_version="", jaxlib_version="", python_version="") == 1
    assert not [k for k in s if k[0].startswith(("jaxmon_workload", "jaxmon_spool", "jaxmon_jit"))]


def _render(collector: SpoolCollector, state: SpoolState) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(collector.families(Snapshot(), state))))
    return generate_latest(registry).decode()


def test_a_published_document_becomes_its_workloads_families(tmp_path: Path) -> None:
    """tests/fixtures/spool_document.json in a spool directory: one workload with its device, memory numbers,
    compile counters and identity; the report time is the file's mtime."""
    document = FIXTURES / "spool_document.json"
    path = tmp_path / "fixture.host-a.4242.json"
    path.write_text(document.read_text())
    ctx = standalone_context(ReplaySource(FIXTURES / "shapes.json"))
    collector = SpoolCollector(SpoolOptions(dir=tmp_path, ttl=3600.0), ctx)
    # A process new to this jaxmon: its counters read 0 until a scrape has served them (jaxmon.births), so that
    # Prometheus sees all of them, and a restart as a reset.
    first = collector.update()
    held = parse_samples(_render(collector, first.state))
    ident = {"workload": "fixture", "process_index": "0"}
    assert sample(held, "jaxmon_jit_compilations_total", **ident) == 0
    assert sample(held, "jaxmon_compilation_cache_misses_total", **ident) == 0
    assert (
        sample(parse_samples(_render(collector, collector.update().state)), "jaxmon_jit_compilations_total", **ident)
        == 0
    )
    SCRAPES.serve_one()  # a Prometheus scrape read the 0
    update = collector.update()
    assert update.success
    s = parse_samples(_render(collector, update.state))
    gpu = {"device": "0", "platform": "gpu", "workload": "fixture"}
    assert sample(s, "jaxmon_memory_bytes_in_use", **gpu) == 1610612736
    assert sample(s, "jaxmon_memory_free_bytes", **gpu) == 64424509440 - 1610612736
    # Pool-aware: 1 - largest free block / (pool - in use) = 1 - 256 MiB / 512 MiB.
    assert sample(s, "jaxmon_memory_fragmentation_ratio", **gpu) == 0.5
    assert sample(s, "jaxmon_jit_compilations_total", **ident) == 3
    assert sample(s, "jaxmon_compilation_cache_misses_total", **ident) == 2
    info = {**ident, "host": "host-a", "pid": "4242", "jax_version": "0.10.2"}
    assert sample(s, "jaxmon_workload_info", **info) == 1
    assert sample(s, "jaxmon_workload_last_report_timestamp_seconds", **ident) == path.stat().st_mtime
    assert sample(s, "jaxmon_spool_rejected_files_total", reason="bad_json") == 0
    collector.stop()


def test_a_published_tpu_dict_keeps_its_reservation(tmp_path: Path) -> None:
    """A publisher writes memory_stats() as JAX returned it: the v5e chip's reservation keys reach the sidecar, which
    leaves the reservation out of free memory and exports it (the real dict of tests/fixtures/tpu_reserved.json)."""
    doc = json.loads((FIXTURES / "spool_document.json").read_text())
    v5e = json.loads((FIXTURES / "tpu_reserved.json").read_text())["devices"][0]
    doc["devices"][0].update(platform="tpu", device_kind=v5e["device_kind"], memory_stats=v5e["memory_stats"])
    (tmp_path / "fixture.host-a.4242.json").write_text(json.dumps(doc))
    collector = SpoolCollector(SpoolOptions(dir=tmp_path, ttl=3600.0), standalone_context(ReplaySource(SHAPES)))
    update = collector.update()
    assert update.success
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(collector.families(Snapshot(), update.state))))
    s = parse_samples(generate_latest(registry).decode())
    tpu = {"device": "0", "platform": "tpu", "workload": "fixture"}
    assert sample(s, "jaxmon_memory_reserved_bytes", **tpu) == 335_675_392
    assert sample(s, "jaxmon_memory_peak_reserved_bytes", **tpu) == 335_675_392
    assert sample(s, "jaxmon_memory_reservable_limit_bytes", **tpu) == 16_673_775_104
    assert sample(s, "jaxmon_memory_free_bytes", **tpu) == 16_909_336_064 - 209_443_328 - 335_675_392
    collector.stop()
