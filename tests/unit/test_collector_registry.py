"""The collector registry: flags per collector, collect[] filtering, guarded updates.

--no-collector.memory and an explicit collector that cannot run are tested in tests/unit/test_web_app.py; the
daemon's own process_* families in tests/e2e/test_daemon_replay.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import Metric

from jaxmon.collectors import registry
from jaxmon.collectors.base import Collector, CollectorOptions, Update, standalone_context
from jaxmon.compose import build_runtime, load_settings
from jaxmon.snapshot import Snapshot
from jaxmon.sources.replay import ReplaySource
from tests.conftest import FIXTURES, parse_samples, sample
from tests.unit.test_web_app import make_app, make_runtime, request


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


FORMS = (("--no-collector.{}", False), ("--collector.{}", True), ("--collector.{}=auto", "auto"))


def test_every_collector_has_node_exporter_style_flags() -> None:
    """--collector.X, --no-collector.X and --collector.X=auto set the section's `enabled`, and no other section's.

    Every collector's flag in each call (a settings load builds the whole parser: a call per collector and form was
    most of this file's time), each collector given each form once per round of three calls, and every collector's
    section read after each. A round per digit of the collectors' numbers in base 3: any two collectors are given
    different forms throughout some round, so a flag that set another collector's section would show."""
    names = list(registry())
    assert {"memory", "probe", "compile", "spool"} <= set(names)
    digits = 1
    while 3**digits < len(names):
        digits += 1
    for digit in range(digits):
        for shift in range(3):
            forms = {name: FORMS[(i // 3**digit + shift) % 3] for i, name in enumerate(names)}
            settings = load_settings([flag.format(name) for name, (flag, _) in forms.items()])
            enabled = {name: settings.collector_options(name).enabled for name in names}
            assert enabled == {name: value for name, (_, value) in forms.items()}, forms


def test_collect_filter_returns_only_the_named_collectors_families(tmp_path: Path) -> None:
    """collect[]=spool: the spool collector's families and its collector_* series, nothing else."""
    spool = tmp_path / "spool"
    spool.mkdir()
    rt = make_runtime("--collector.spool.dir", str(spool))
    try:
        rt.update_all_once()
        app = make_app(rt)
        text = request(app, "GET", "/metrics", b"collect[]=spool").text
        both = parse_samples(request(app, "GET", "/metrics", b"collect[]=spool&collect[]=memory").text)
    finally:
        rt.stop()
    assert _families(text) == {
        "jaxmon_spool_rejected_files_total",
        "jaxmon_spool_overflow_files_total",
        "jaxmon_spool_removed_files_total",
        "jaxmon_spool_stale_files",
        "jaxmon_collector_success",
        "jaxmon_collector_duration_seconds",
        "jaxmon_collector_last_success_timestamp_seconds",
    }
    samples = parse_samples(text)
    assert sample(samples, "jaxmon_collector_success", collector="spool") == 1.0
    assert sample(samples, "jaxmon_collector_success", collector="memory") is None
    assert sample(both, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000.0
    assert sample(both, "jaxmon_build_info") is None


class _Exploding(Collector[CollectorOptions, int]):
    name = "exploding"
    description = "raises on every second update"

    calls = 0

    def update(self) -> Update[int]:
        self.calls += 1
        if self.calls % 2 == 0:
            raise OSError("disk on fire")
        return Update(self.calls)

    def families(self, snap: Snapshot, state: int) -> Iterator[Metric]:
        return iter(())


def test_a_raising_update_is_a_failed_run_that_keeps_the_last_state() -> None:
    """The runtime guards every update: success 0, last state kept, last-success time unchanged."""
    settings = load_settings(["--replay", str(FIXTURES / "shapes.json")])
    runtime = build_runtime(settings, ReplaySource(FIXTURES / "shapes.json"))
    exploding = _Exploding(CollectorOptions(), standalone_context(ReplaySource(FIXTURES / "shapes.json")))
    try:
        (job,) = exploding.jobs()
        runtime.run_job(exploding, job)
        first = runtime.snapshot()
        assert first.states["exploding"] == 1 and first.statuses["exploding"].success
        runtime.run_job(exploding, job)
        second = runtime.snapshot()
        assert second.states["exploding"] == 1
        assert second.statuses["exploding"].success is False
        assert second.statuses["exploding"].last_success_timestamp == first.statuses["exploding"].last_success_timestamp
    finally:
        runtime.stop()
