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
from jaxmon.device_readings import DeviceInfo
from jaxmon.exchange import DutyCycles
from jaxmon.snapshot import Snapshot
from jaxmon.sources.local import LocalSource
from tests.conftest import Samples, parse_samples, sample
from tests.fake_libtpu import MEGASCALE, Chip, Entry, FakeLibtpu, Scenario, Timing, connection, served_without, sized

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
    # libtpu's gRPC service alone: the SDK child has its own tests (test_tpu_sdk.py)
    return TpuCollector(TpuOptions(enabled=True, address=address, timeout=timeout, sdk=False), context)


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
    # 1 s: the first call (which connects) must still answer within it on a loaded machine.
    collector = make(context, fake.address, timeout=1.0)
    assert collector.update().success
    fake.update(delay=5.0)
    started = time.monotonic()
    update = collector.update()
    elapsed = time.monotonic() - started
    # Bounded by the 1 s deadline (with room for a loaded machine), not by the service's 5 s answer.
    assert elapsed < 3.5, elapsed
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


# --------------------------------------------------------------------------------------------------------------
# The tensorcore idle duration and the host's megascale distributions
# --------------------------------------------------------------------------------------------------------------

# The six sized megascale metrics (tpu-info's short name, libtpu's name, jaxmon's family), each with its own scale.
SIZED = (
    ("buffer_transfer_latency", MetricName.BUFFER_TRANSFER_LATENCY_US, "jaxmon_megascale_dcn_transfer_latency_seconds"),
    (
        "inbound_buffer_transfer_latency",
        MetricName.INBOUND_BUFFER_TRANSFER_LATENCY_US,
        "jaxmon_megascale_dcn_inbound_transfer_latency_seconds",
    ),
    (
        "host_to_device_transfer_latency",
        MetricName.HOST_TO_DEVICE_TRANSFER_LATENCY_US,
        "jaxmon_megascale_host_to_device_transfer_latency_seconds",
    ),
    (
        "device_to_host_transfer_latency",
        MetricName.DEVICE_TO_HOST_TRANSFER_LATENCY_US,
        "jaxmon_megascale_device_to_host_transfer_latency_seconds",
    ),
    (
        "collective_e2e_latency",
        MetricName.COLLECTIVE_E2E_LATENCY_US,
        "jaxmon_megascale_collective_end_to_end_latency_seconds",
    ),
    ("host_compute_latency", MetricName.HOST_COMPUTE_LATENCY_US, "jaxmon_megascale_host_compute_latency_seconds"),
)
RTT_FAMILY = "jaxmon_megascale_grpc_tcp_min_rtt_seconds"
RATE_FAMILY = "jaxmon_megascale_grpc_tcp_delivery_rate_bytes_per_second"
MEGASCALE_FAMILIES = (*(family for _, _, family in SIZED), RTT_FAMILY, RATE_FAMILY)
DCN = MetricName.BUFFER_TRANSFER_LATENCY_US.value


def host_entries() -> dict[str, list[Entry]]:
    """Every megascale metric: the sized ones with two streams of 8MB+ and one of 4MB+ transfers, in buckets
    [0,1) [1,2) [2,4) [4,8) [8,16) [16,32) [32,inf) x k ms for the k-th metric; the gRPC ones over 4 connections."""
    host: dict[str, list[Entry]] = {}
    for k, (_, name, _) in enumerate(SIZED, start=1):
        scale = 1000.0 * k
        host[name.value] = [
            sized("8MB+", [0, 0, 100, 300, 400, 200, 0], stream=0, scale=scale, mean=9000.0 * k),
            sized("8MB+", [0, 0, 0, 200, 500, 300, 0], stream=1, scale=scale, mean=11000.0 * k),
            sized("4MB+", [0, 500, 500, 0, 0, 0, 0], stream=0, scale=scale, mean=2000.0 * k),
        ]
    # Buckets [0,10) [10,20) [20,40) [40,80) [80,inf) µs, and the same in Mbps x 100 for the delivery rate.
    host[MetricName.GRPC_TCP_MIN_RTT_US.value] = [
        connection(c, [0, 0, 250, 250, 0], scale=10.0, mean=40.0) for c in range(4)
    ]
    host[MetricName.GRPC_TCP_DELIVERY_RATE_MBPS.value] = [
        connection(c, [0, 0, 250, 250, 0], scale=1000.0, mean=4000.0) for c in range(4)
    ]
    return host


@pytest.fixture
def multislice() -> Iterator[FakeLibtpu]:
    """A multi-slice job's libtpu: every chip with an idle duration, every megascale metric with entries."""
    chips = scenario_chips()
    for i, chip in enumerate(chips.values()):
        chip.idle_s = 0.5 + 10 * i
    server = FakeLibtpu(Scenario(chips=chips, host=host_entries())).start()
    yield server
    server.stop()


def host(**labels: str) -> dict[str, str]:
    return {"source": "libtpu", **labels}


def test_the_idle_duration_and_every_megascale_distribution_match_what_libtpu_serves(
    context: Context, multislice: FakeLibtpu
) -> None:
    collector = make(context, multislice.address)
    update = collector.update()
    assert update.success, update.state.error
    samples = render(collector, update)
    for i, dev in enumerate(IDS):
        assert sample(samples, "jaxmon_device_tensorcore_idle_duration_seconds", **labels(dev)) == 0.5 + 10 * i
    # By hand, the k-th sized metric, 8MB+: the two streams summed are [0, 0, 100, 500, 900, 500, 0] (2000
    # transfers). p50: rank 1000 is the 400th of the 900 in [8, 16) k ms; p999: rank 1998 the 498th of the 500 in
    # [16, 32) k ms. The sum is 1000 x 9 k ms + 1000 x 11 k ms. 4MB+: 1000 transfers, the median at the top of
    # [1, 2) k ms.
    for k, (_, _, family) in enumerate(SIZED, start=1):
        big, small = host(buffer_size="8MB+"), host(buffer_size="4MB+")
        got = sample(samples, family, **big, quantile="0.5")
        assert got == pytest.approx((8 + 8 * 400 / 900) * k * 1e-3), family
        assert sample(samples, family, **big, quantile="0.999") == pytest.approx((16 + 16 * 498 / 500) * k * 1e-3)
        assert sample(samples, family + "_count", **big) == 2000
        assert sample(samples, family + "_sum", **big) == pytest.approx(20.0 * k)
        assert sample(samples, family, **small, quantile="0.5") == pytest.approx(2 * k * 1e-3)
        assert sample(samples, family + "_count", **small) == 1000
        assert sample(samples, family + "_sum", **small) == pytest.approx(2.0 * k)
    # The gRPC ones: 4 connections of [0, 0, 250, 250, 0] summed, one distribution for the host (no buffer_size):
    # the median at the top of [20, 40) µs, p90 (rank 1800) the 800th of the 1000 in [40, 80) µs.
    assert sample(samples, RTT_FAMILY, **host(quantile="0.5")) == pytest.approx(40e-6)
    assert sample(samples, RTT_FAMILY, **host(quantile="0.9")) == pytest.approx(72e-6)
    assert sample(samples, RTT_FAMILY + "_count", **host()) == 2000
    assert sample(samples, RTT_FAMILY + "_sum", **host()) == pytest.approx(2000 * 40e-6)
    # The delivery rate in bytes per second: 4000 Mbps is 5e8 B/s.
    assert sample(samples, RATE_FAMILY, **host(quantile="0.5")) == pytest.approx(4000 * 125_000)
    assert sample(samples, RATE_FAMILY + "_sum", **host()) == pytest.approx(2000 * 4000 * 125_000)
    collector.stop()


def test_megascale_percentiles_and_idle_durations_agree_with_tpu_infos_own_client(
    context: Context, multislice: FakeLibtpu
) -> None:
    collector = make(context, multislice.address)
    samples = render(collector, collector.update())
    rows = [(arg, family, 1e-6) for arg, _, family in SIZED]
    rows += [("grpc_tcp_min_rtt", RTT_FAMILY, 1e-6), ("grpc_tcp_delivery_rate", RATE_FAMILY, 125_000.0)]
    for arg, family, to_base in rows:
        reference = tpu_info_metrics.get_transfer_latency(arg, addr=multislice.address)
        assert reference, arg
        for ref in reference:
            # tpu-info groups a gRPC metric's entries by their first string attribute: none here, so one group.
            size = {} if family in (RTT_FAMILY, RATE_FAMILY) else {"buffer_size": ref.transfer_size}
            for q, want in (("0.5", ref.p50), ("0.9", ref.p90), ("0.95", ref.p95), ("0.999", ref.p999)):
                got = sample(samples, family, **host(**size), quantile=q)
                assert got == pytest.approx(want * to_base), (arg, ref.transfer_size, q)
    idle = dict(tpu_info_metrics.get_tensorcore_idle_duration(addr=multislice.address))
    assert set(idle) == set(IDS)
    for dev, seconds in idle.items():
        assert sample(samples, "jaxmon_device_tensorcore_idle_duration_seconds", **labels(dev)) == seconds
    collector.stop()


def test_metrics_a_libtpu_does_not_list_are_never_asked_for_and_logged_once(
    context: Context, multislice: FakeLibtpu
) -> None:
    new = {*MEGASCALE, MetricName.TENSORCORE_IDLE_DURATION.value}
    multislice.update(supported=served_without(new))
    collector = make(context, multislice.address)
    with capture_logs() as logs:
        updates = [collector.update() for _ in range(3)]
    assert all(u.success for u in updates), "a libtpu that serves fewer metrics is no failure"
    assert not new & set(multislice.scenario.requested)
    samples = render(collector, updates[-1])
    assert not [name for name, _ in samples if name.startswith("jaxmon_megascale_") or "idle" in name]
    assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(8)) == multislice.scenario.chips[8].used_bytes
    lines = [e for e in logs if e["event"].startswith("libtpu does not serve")]
    assert len(lines) == 1 and set(lines[0]["metrics"]) == new
    collector.stop()


@pytest.mark.parametrize("status", [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE])
def test_megascale_metrics_refused_outside_a_multislice_job_are_absent_not_a_failure(
    context: Context, multislice: FakeLibtpu, status: grpc.StatusCode
) -> None:
    # Listed, but answered as tpu-info says libtpu answers outside a MULTI_SLICE workload.
    multislice.update(failing=dict.fromkeys(MEGASCALE, status))
    collector = make(context, multislice.address)
    with capture_logs() as logs:
        updates = [collector.update() for _ in range(3)]
    assert all(u.success for u in updates)
    samples = render(collector, updates[-1])
    assert not [name for name, _ in samples if name.startswith("jaxmon_megascale_")]
    assert sample(samples, "jaxmon_device_tensorcore_idle_duration_seconds", **labels(9)) == 10.5
    lines = [e for e in logs if e["event"].startswith("libtpu does not serve")]
    assert len(lines) == 1 and set(lines[0]["metrics"]) == MEGASCALE
    collector.stop()


def test_a_listed_megascale_metric_that_fails_is_absent_alone_and_logged_once(
    context: Context, multislice: FakeLibtpu
) -> None:
    multislice.update(failing={DCN: grpc.StatusCode.INTERNAL})
    collector = make(context, multislice.address)
    with capture_logs() as logs:
        updates = [collector.update() for _ in range(3)]
        assert not any(u.success for u in updates), "a listed metric that fails makes the poll partial"
        samples = render(collector, updates[-1])
        assert not [name for name, _ in samples if name.startswith("jaxmon_megascale_dcn_transfer")]
        for family in MEGASCALE_FAMILIES[1:]:
            assert sample(samples, family + "_count", **host(**({} if "grpc" in family else {"buffer_size": "4MB+"})))
        multislice.update(failing={})
        update = collector.update()
    assert update.success
    assert sample(render(collector, update), SIZED[0][2] + "_count", **host(buffer_size="8MB+")) == 2000
    failed = [e for e in logs if e["event"] == "libtpu metric failed; its series are absent"]
    assert [(e["metric"], e["error"]) for e in failed] == [(DCN, "INTERNAL")]
    assert [e["metric"] for e in logs if e["event"] == "libtpu metric answers again"] == [DCN]
    collector.stop()


def test_a_distribution_shape_jaxmon_does_not_read_is_absent_and_logged_once(
    context: Context, multislice: FakeLibtpu
) -> None:
    entries = host_entries()
    entries[DCN] = [replace(e, as_summary=True) for e in entries[DCN]]
    multislice.update(host=entries)
    collector = make(context, multislice.address)
    with capture_logs() as logs:
        updates = [collector.update() for _ in range(3)]
    assert all(u.success for u in updates)  # libtpu answered what it lists
    samples = render(collector, updates[-1])
    assert not [name for name, _ in samples if name.startswith("jaxmon_megascale_dcn_transfer")]
    assert sample(samples, SIZED[1][2] + "_count", **host(buffer_size="4MB+")) == 1000
    assert [e["metric"] for e in logs if "shape jaxmon does not read" in e["event"]] == [DCN]
    collector.stop()


def test_every_call_of_a_poll_is_in_flight_at_once(context: Context, multislice: FakeLibtpu) -> None:
    collector = make(context, multislice.address, timeout=2.0)
    assert collector.update().success  # connected, metrics listed
    asked = len(multislice.scenario.requested)
    assert asked == 15  # 3 core + HBM bandwidth, idle, HLO queue, HLO timing + 8 megascale
    multislice.update(delay=0.4)
    started = time.monotonic()
    update = collector.update()
    elapsed = time.monotonic() - started
    # 15 calls of 0.4 s each one after another would take 6 s, past the 2 s deadline.
    assert update.success, update.state.error
    assert elapsed < 1.9, elapsed
    assert len(multislice.scenario.requested) == 2 * asked
    collector.stop()
