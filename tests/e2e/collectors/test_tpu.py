"""The tpu collector in-process against a real gRPC libtpu service on loopback (tests/fake_libtpu.py).

The daemon's own JAX is real and on CPU, as in a sidecar beside a TPU job that holds every chip. When `auto` runs
the collector, and its flags, are tests/unit/collectors/test_tpu.py.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from structlog.testing import capture_logs
from tpu_info import metrics as tpu_info_metrics
from tpu_info.metrics import MetricName

from jaxmon.collectors.base import Context, Update, standalone_context
from jaxmon.collectors.tpu import TpuCollector, TpuOptions, TpuState
from jaxmon.exchange import DutyCycles
from jaxmon.model import DeviceInfo
from jaxmon.snapshot import Snapshot
from jaxmon.sources.local import LocalSource
from tests.conftest import Samples, parse_samples, sample
from tests.fake_libtpu import Chip, FakeLibtpu, Scenario, Timing

IDS = (8, 9, 12, 13)
GIB = 1 << 30


def scenario_chips() -> dict[int, Chip]:
    """Distinct values per device, so a value reported under the wrong device-id cannot pass."""
    return {
        dev: Chip(
            total_bytes=(16 + i) * GIB,
            used_bytes=(3 + 2 * i) * GIB + 12345,
            duty_cycle_pct=12.5 + 20 * i,
            hbm_util_pct=7.25 + 10 * i,
            hlo_queue=i + 1,
            # 1000 executions, all in bucket 3 = [4, 8) µs (scale 1, growth 2): quantile q is 4 + 4q µs.
            timing=Timing(counts=[0, 0, 0, 1000, 0, 0], scale=1.0, growth=2.0, mean_us=5.5 + i),
        )
        for i, dev in enumerate(IDS)
    }


@pytest.fixture(scope="module")
def context() -> Context:
    source = LocalSource(environ={})
    devices, _ = source.discover()
    return standalone_context(source, devices)


@pytest.fixture
def fake() -> Iterator[FakeLibtpu]:
    server = FakeLibtpu(Scenario(chips=scenario_chips())).start()
    yield server
    server.stop()


def make(context: Context, address: str, timeout: float = 1.0) -> TpuCollector:
    return TpuCollector(TpuOptions(enabled=True, address=address, timeout=timeout), context)


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def render(collector: TpuCollector, update: Update[TpuState]) -> Samples:
    """The collector's families as exposition text, parsed back: what a scrape of them would read."""
    families = [f for f in collector.families(Snapshot(), update.state) if f.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return parse_samples(generate_latest(registry).decode())


def labels(dev: int) -> dict[str, str]:
    return {"device": str(dev), "platform": "tpu", "source": "libtpu"}


def device_series(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def test_every_series_matches_the_scenario_libtpu_serves(context: Context, fake: FakeLibtpu) -> None:
    collector = make(context, fake.address)
    update = collector.update()
    assert update.success, update.state.error
    samples = render(collector, update)
    for i, dev in enumerate(IDS):
        chip = fake.scenario.chips[dev]
        assert sample(samples, "jaxmon_device_source_up", **labels(dev)) == 1
        assert sample(samples, "jaxmon_device_memory_total_bytes", **labels(dev)) == chip.total_bytes
        assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(dev)) == chip.used_bytes
        assert sample(samples, "jaxmon_device_duty_cycle_ratio", **labels(dev)) == pytest.approx((12.5 + 20 * i) / 100)
        assert sample(samples, "jaxmon_device_memory_bandwidth_utilization_ratio", **labels(dev)) == pytest.approx(
            (7.25 + 10 * i) / 100
        )
        assert sample(samples, "jaxmon_device_hlo_queue_size", **labels(dev)) == i + 1
        assert sample(samples, "jaxmon_device_hlo_execution_mean_seconds", **labels(dev)) == pytest.approx(
            (5.5 + i) * 1e-6
        )
        for q in (0.5, 0.9, 0.95, 0.999):
            got = sample(samples, "jaxmon_device_hlo_execution_seconds", **labels(dev), percentile=f"{q * 100:g}")
            assert got == pytest.approx((4 + 4 * q) * 1e-6), q
    # Nothing under ids libtpu did not report (JAX's CPU ids 0..7 are not TPU devices).
    assert {dict(lbls)["device"] for _, lbls in samples} == {str(d) for d in IDS}
    collector.stop()


def test_hlo_quantiles_agree_with_tpu_infos_own_client(context: Context, fake: FakeLibtpu) -> None:
    # A spread-out distribution: 1000 executions over buckets [1,2) [2,4) [4,8) [8,16) µs, a few in the overflow.
    spread = Timing(counts=[0, 100, 400, 300, 195, 5], scale=1.0, growth=2.0, mean_us=4.0)
    for dev in IDS:
        fake.scenario.chips[dev].timing = spread
    collector = make(context, fake.address)
    samples = render(collector, collector.update())
    reference = {t.device_id: t for t in tpu_info_metrics.get_hlo_exec_timing(None, addr=fake.address)}
    assert set(reference) == set(IDS)
    for dev in IDS:
        ref = reference[dev]
        for q, want_us in ((0.5, ref.p50), (0.9, ref.p90), (0.95, ref.p95)):
            got = sample(samples, "jaxmon_device_hlo_execution_seconds", **labels(dev), percentile=f"{q * 100:g}")
            assert got == pytest.approx(want_us * 1e-6), (dev, q)
    # By hand. p50: rank 500 is the last of the 400 in [2,4) µs -> 4 µs. p90: 100 + 400 + 300 = 800 lie below
    # 8 µs, so rank 900 is the 100th of the 195 in [8,16) µs -> 8 + 8 * 100/195 µs.
    assert sample(samples, "jaxmon_device_hlo_execution_seconds", **labels(8), percentile="50") == pytest.approx(4e-6)
    assert sample(samples, "jaxmon_device_hlo_execution_seconds", **labels(8), percentile="90") == pytest.approx(
        (8 + 8 * 100 / 195) * 1e-6
    )
    # p99.9 (rank 999) lies in the overflow bucket: its lower bound, 16 µs, never an invented upper one.
    assert sample(samples, "jaxmon_device_hlo_execution_seconds", **labels(8), percentile="99.9") == pytest.approx(
        16e-6
    )
    collector.stop()


def test_an_older_libtpu_with_integer_device_ordinals_reads_the_same(context: Context, fake: FakeLibtpu) -> None:
    fake.update(ordinal_as_string=False)
    collector = make(context, fake.address)
    samples = render(collector, collector.update())
    for i, dev in enumerate(IDS):
        assert sample(samples, "jaxmon_device_hlo_queue_size", **labels(dev)) == i + 1
        assert sample(samples, "jaxmon_device_hlo_execution_mean_seconds", **labels(dev)) == pytest.approx(
            (5.5 + i) * 1e-6
        )
    collector.stop()


def test_metrics_this_libtpu_does_not_serve_are_absent_not_zero(context: Context, fake: FakeLibtpu) -> None:
    core = {MetricName.TOTAL_MEMORY.value, MetricName.MEMORY_USAGE.value, MetricName.DUTY_CYCLE_PCT.value}
    fake.update(supported=core)
    collector = make(context, fake.address)
    update = collector.update()
    assert update.success
    samples = render(collector, update)
    assert device_series(samples) == {
        "jaxmon_device_source_up",
        "jaxmon_device_memory_total_bytes",
        "jaxmon_device_memory_used_bytes",
        "jaxmon_device_duty_cycle_ratio",
    }
    collector.stop()


def test_an_older_libtpu_that_cannot_list_its_metrics_serves_what_it_has(context: Context, fake: FakeLibtpu) -> None:
    # ListSupportedMetrics is UNIMPLEMENTED and HLO metrics are refused (NOT_FOUND): they are absent, not a failure.
    core = {MetricName.TOTAL_MEMORY.value, MetricName.MEMORY_USAGE.value, MetricName.DUTY_CYCLE_PCT.value}
    fake.update(listing=False, supported={*core, MetricName.HBM_BW_UTIL.value})
    collector = make(context, fake.address)
    update = collector.update()
    assert update.success
    samples = render(collector, update)
    assert sample(samples, "jaxmon_device_memory_bandwidth_utilization_ratio", **labels(13)) == pytest.approx(0.3725)
    assert "jaxmon_device_hlo_queue_size" not in device_series(samples)
    assert "jaxmon_device_hlo_execution_seconds" not in device_series(samples)
    collector.stop()


def test_a_metric_the_service_lists_but_fails_to_answer_fails_the_poll(context: Context, fake: FakeLibtpu) -> None:
    # HLO timing is listed but answered with INTERNAL: the poll is partial (success 0); what answered is served.
    fake.update(failing={MetricName.HLO_EXECUTION_TIMING_DISTRIBUTION_MICROSECONDS.value: grpc.StatusCode.INTERNAL})
    collector = make(context, fake.address)
    update = collector.update()
    assert not update.success
    samples = render(collector, update)
    assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(8)) == fake.scenario.chips[8].used_bytes
    assert sample(samples, "jaxmon_device_hlo_queue_size", **labels(8)) == 1
    assert "jaxmon_device_hlo_execution_seconds" not in device_series(samples)
    collector.stop()


def test_a_device_dropped_from_the_response_goes_down_alone(context: Context, fake: FakeLibtpu) -> None:
    collector = make(context, fake.address)
    assert collector.update().success
    kept = fake.scenario.chips[12]
    fake.set_chip(12, None)
    update = collector.update()
    # The service answered: the collector succeeded, and only device 12 is down, with no values of its own.
    assert update.success
    samples = render(collector, update)
    assert sample(samples, "jaxmon_device_source_up", **labels(12)) == 0
    assert [name for name, lbls in samples if dict(lbls)["device"] == "12"] == ["jaxmon_device_source_up"]
    for dev in (8, 9, 13):
        assert sample(samples, "jaxmon_device_source_up", **labels(dev)) == 1
        want = fake.scenario.chips[dev].used_bytes
        assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(dev)) == want
    # It comes back with its new values.
    kept.used_bytes = 5 * GIB
    fake.set_chip(12, kept)
    samples = render(collector, collector.update())
    assert sample(samples, "jaxmon_device_source_up", **labels(12)) == 1
    assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(12)) == 5 * GIB
    collector.stop()


def test_values_follow_the_service_from_poll_to_poll(context: Context, fake: FakeLibtpu) -> None:
    collector = make(context, fake.address)
    collector.update()
    fake.scenario.chips[9].duty_cycle_pct = 99.5
    fake.scenario.chips[9].used_bytes = 15 * GIB
    samples = render(collector, collector.update())
    assert sample(samples, "jaxmon_device_duty_cycle_ratio", **labels(9)) == pytest.approx(0.995)
    assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(9)) == 15 * GIB
    collector.stop()


def test_an_unavailable_service_fails_the_collector_and_drops_every_device_series(
    context: Context, fake: FakeLibtpu
) -> None:
    collector = make(context, fake.address)
    assert collector.update().success
    fake.update(status=grpc.StatusCode.UNAVAILABLE)
    update = collector.update()
    assert not update.success
    assert update.state.error is not None and "UNAVAILABLE" in update.state.error
    assert render(collector, update) == {}
    # The job restarts on fewer chips: the devices of the old run are forgotten, not reported down.
    fake.set_chip(12, None)
    fake.set_chip(13, None)
    fake.update(status=None)
    update = collector.update()
    assert update.success
    samples = render(collector, update)
    assert {dict(lbls)["device"] for _, lbls in samples} == {"8", "9"}
    assert sample(samples, "jaxmon_device_source_up", **labels(9)) == 1
    collector.stop()


def test_a_slow_service_is_cut_off_at_the_deadline(context: Context, fake: FakeLibtpu) -> None:
    collector = make(context, fake.address, timeout=0.3)
    assert collector.update().success
    fake.update(delay=5.0)
    started = time.monotonic()
    update = collector.update()
    elapsed = time.monotonic() - started
    # Bounded by the 0.3 s deadline (with room for a loaded machine), not by the service's 5 s answer.
    assert elapsed < 2.5, elapsed
    assert not update.success
    assert update.state.error is not None and "DEADLINE_EXCEEDED" in update.state.error
    assert render(collector, update) == {}
    collector.stop()


def reserved_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_listening_is_logged_once_and_the_service_is_picked_up_when_it_appears(context: Context) -> None:
    port = reserved_port()
    collector = make(context, f"127.0.0.1:{port}", timeout=0.5)
    with capture_logs() as logs:
        for _ in range(4):
            update = collector.update()
            assert not update.success
            assert render(collector, update) == {}
    down = [e for e in logs if e["event"] == "libtpu runtime metrics unavailable"]
    assert len(down) == 1, logs
    assert down[0]["error"] == "UNAVAILABLE" and down[0]["address"] == f"127.0.0.1:{port}"

    server = FakeLibtpu(Scenario(chips=scenario_chips()), port=port).start()
    try:
        with capture_logs() as logs:
            deadline = time.monotonic() + 20
            while not (update := collector.update()).success and time.monotonic() < deadline:
                time.sleep(0.2)
        assert update.success, update.state.error
        assert [e["event"] for e in logs].count("libtpu runtime metrics answer") == 1
        samples = render(collector, update)
        assert sample(samples, "jaxmon_device_memory_total_bytes", **labels(8)) == 16 * GIB
    finally:
        server.stop()
        collector.stop()


def test_the_probe_sees_a_duty_cycle_only_where_jax_sees_libtpus_ids(context: Context, fake: FakeLibtpu) -> None:
    # The probe defers calibration on a busy device through devicewide.DutyCycles: it asks by JAX id.
    assert isinstance(TpuState(), DutyCycles)
    sidecar = make(context, fake.address)  # JAX on CPU: no JAX TPU device is libtpu's
    state = sidecar.update().state
    assert state.duty_cycle("tpu", 8) is None and state.duty_cycle("cpu", 0) is None
    sidecar.stop()

    def with_jax_tpus(ids: tuple[int, ...]) -> TpuState:
        devices = [DeviceInfo(id=i, platform="tpu", device_kind="TPU v5 lite") for i in ids]
        ctx = replace(context, devices=tuple(devices))
        collector = TpuCollector(TpuOptions(enabled=True, address=fake.address, timeout=1.0), ctx)
        try:
            return collector.update().state
        finally:
            collector.stop()

    embedded = with_jax_tpus(IDS)  # jaxmon inside the trainer: the same chips, by the same ids
    assert embedded.duty_cycle("tpu", 12) == pytest.approx((12.5 + 20 * 2) / 100)  # chip 12 is the third
    with capture_logs() as logs:
        other = with_jax_tpus((0, 1, 2, 3))  # ids that are not libtpu's: no guess
    assert other.duty_cycle("tpu", 0) is None and other.duty_cycle("tpu", 8) is None
    assert [e["event"] for e in logs if "differ" in e["event"]], logs
