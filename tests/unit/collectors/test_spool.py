"""The spool collector in-process: a published workload's report turned into its families, and the exposition's
last line of defence against a number that cannot be rendered.

The sidecar daemon reading real spool directories is tests/e2e/test_spool_hardening.py and tests/e2e/test_workloads.py.
"""

from __future__ import annotations

from pathlib import Path

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.memory import MemoryCollector, MemoryOptions, MemoryState
from jaxmon.collectors.spool import SpoolCollector, SpoolOptions, SpoolState, WorkloadReport
from jaxmon.exposition import Exposition
from jaxmon.snapshot import Snapshot
from jaxmon.sources.replay import ReplaySource
from tests.conftest import FIXTURES, parse_samples, sample


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
