"""`jaxmon serve --collector.tpu` as a real process (JAX on CPU, as a sidecar beside a TPU job), scraped over HTTP,
reading a real gRPC libtpu runtime metrics service on loopback (tests/fake_libtpu.py) whose answers the test writes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.conftest import Daemon, Samples, StartDaemon, free_port, promtool, sample
from tests.deploy_files import readme_metrics
from tests.fake_libtpu import MEGASCALE, Chip, Entry, FakeLibtpu, Scenario, Timing, connection, served_without, sized
from tests.helpers import parse_samples, wait_for_fresh_samples

GIB = 1 << 30
IDS = (8, 9, 12, 13)


def chips() -> dict[int, Chip]:
    return {
        dev: Chip(
            total_bytes=16 * GIB,
            used_bytes=(2 + i) * GIB + 4096 * i,
            duty_cycle_pct=15.0 + 20 * i,
            hbm_util_pct=3.5 + i,
            hlo_queue=2 * i,
            # 400 executions in [1,2) ms and 600 in [2,4) ms (scale 1000 µs, growth 2): p50 = 2 + 2 * 100/600 ms.
            timing=Timing(counts=[0, 400, 600, 0], scale=1000.0, growth=2.0, mean_us=2100.0 + i),
        )
        for i, dev in enumerate(IDS)
    }


def labels(dev: int) -> dict[str, str]:
    return {"device": str(dev), "platform": "tpu", "source": "libtpu"}


def tpu_devices(samples: Samples) -> set[str]:
    return {dict(lbls)["device"] for name, lbls in samples if name == "jaxmon_device_source_up"}


def success(samples: Samples) -> float | None:
    return sample(samples, "jaxmon_collector_success", collector="tpu")


@pytest.fixture
def fake() -> Iterator[FakeLibtpu]:
    server = FakeLibtpu(Scenario(chips=chips())).start()
    yield server
    server.stop()


def serve(start_daemon: StartDaemon, address: str, *extra: str) -> Daemon:
    return start_daemon(
        "--no-collector.probe",
        "--collector.tpu",
        "--collector.tpu.address",
        address,
        "--collector.tpu.timeout",
        "300ms",
        "--poll.interval",
        "0.3s",
        *extra,
    )


def test_the_sidecar_serves_every_libtpu_series_the_service_answers(
    start_daemon: StartDaemon, fake: FakeLibtpu
) -> None:
    daemon = serve(start_daemon, fake.address)
    samples = daemon.wait_for(lambda s: tpu_devices(s) == {str(d) for d in IDS}, what="four TPU devices")
    assert success(samples) == 1
    for i, dev in enumerate(IDS):
        want = fake.scenario.chips[dev]
        assert sample(samples, "jaxmon_device_source_up", **labels(dev)) == 1
        assert sample(samples, "jaxmon_device_memory_total_bytes", **labels(dev)) == 16 * GIB
        assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(dev)) == want.used_bytes
        assert sample(samples, "jaxmon_device_duty_cycle_ratio", **labels(dev)) == pytest.approx((15 + 20 * i) / 100)
        got = sample(samples, "jaxmon_device_memory_bandwidth_utilization_ratio", **labels(dev))
        assert got == pytest.approx((3.5 + i) / 100)
        assert sample(samples, "jaxmon_device_hlo_queue_size", **labels(dev)) == 2 * i
        assert sample(samples, "jaxmon_device_hlo_execution_mean_seconds", **labels(dev)) == pytest.approx(
            (2100 + i) * 1e-6
        )
        p50 = sample(samples, "jaxmon_device_hlo_execution_seconds", **labels(dev), percentile="50")
        assert p50 == pytest.approx((2000 + 2000 * 100 / 600) * 1e-6)
    # The daemon's own JAX devices are CPU devices: no TPU series carries their ids.
    cpu_ids = {str(i) for i in range(8)}
    assert not [k for k in samples if dict(k[1]).get("source") == "libtpu" and dict(k[1]).get("device") in cpu_ids]

    # /metrics?collect[]=tpu selects the tpu collector's families alone, and they pass Prometheus's own lint.
    r = daemon.get("/metrics", params={"collect[]": "tpu"})
    assert r.status_code == 200
    assert "jaxmon_device_memory_used_bytes" in r.text and "jaxmon_memory_stats_supported" not in r.text
    lint = subprocess.run([promtool(), "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    # Values follow the service.
    fake.scenario.chips[13].duty_cycle_pct = 1.0
    daemon.wait_for(
        lambda s: sample(s, "jaxmon_device_duty_cycle_ratio", **labels(13)) == pytest.approx(0.01),
        what="duty cycle of 13 at 1 %",
    )


def test_naming_the_address_alone_turns_the_collector_on(start_daemon: StartDaemon, fake: FakeLibtpu) -> None:
    """This host shows no TPU chip, so `auto` would stay off; the address given says where the service is."""
    daemon = start_daemon(
        "--no-collector.probe", "--collector.tpu.address", fake.address, "--collector.tpu.timeout", "300ms",
        "--poll.interval", "0.3s",
    )  # fmt: skip
    samples = daemon.wait_for(lambda s: tpu_devices(s) == {str(d) for d in IDS}, what="four TPU devices")
    assert success(samples) == 1


def test_a_dropped_device_goes_down_alone_and_an_unavailable_service_takes_every_device_series(
    start_daemon: StartDaemon, fake: FakeLibtpu
) -> None:
    daemon = serve(start_daemon, fake.address)
    daemon.wait_for(lambda s: len(tpu_devices(s)) == 4, what="four TPU devices")
    fake.set_chip(9, None)
    samples = daemon.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **labels(9)) == 0, what="device 9 down")
    assert success(samples) == 1
    assert [name for name, lbls in samples if dict(lbls).get("device") == "9" and dict(lbls).get("source")] == [
        "jaxmon_device_source_up"
    ]
    for dev in (8, 12, 13):
        assert sample(samples, "jaxmon_device_source_up", **labels(dev)) == 1
        assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(dev)) == fake.scenario.chips[dev].used_bytes

    fake.update(status=grpc.StatusCode.UNAVAILABLE)
    daemon.wait_for(lambda s: success(s) == 0 and not tpu_devices(s), what="no TPU series")
    # Back, with device 9 still missing: the devices of the new session are the ones it reports.
    fake.update(status=None)
    daemon.wait_for(lambda s: success(s) == 1 and tpu_devices(s) == {"8", "12", "13"}, what="back without 9")


def test_nothing_listening_then_the_service_appears(start_daemon: StartDaemon) -> None:
    port = free_port()
    daemon = serve(start_daemon, f"127.0.0.1:{port}")
    samples = daemon.wait_for(lambda s: success(s) == 0, what="tpu collector failing")
    time.sleep(1.5)  # several more polls while nothing listens
    samples = daemon.scrape()
    assert success(samples) == 0
    assert tpu_devices(samples) == set()
    assert daemon.get("/healthz").status_code == 200, "a libtpu that is not there yet is not an unhealthy jaxmon"
    assert daemon.log().count("libtpu runtime metrics unavailable") == 1, daemon.log()

    server = FakeLibtpu(Scenario(chips=chips()), port=port).start()
    try:
        samples = daemon.wait_for(lambda s: success(s) == 1 and len(tpu_devices(s)) == 4, what="service picked up")
        assert sample(samples, "jaxmon_device_memory_used_bytes", **labels(12)) == chips()[12].used_bytes
        assert daemon.log().count("libtpu runtime metrics answer") == 1
        # Training ends: the service goes away, and so do the TPU series (never stale values).
        server.stop()
        daemon.wait_for(lambda s: success(s) == 0 and not tpu_devices(s), what="series dropped")
    finally:
        server.stop()


def test_a_slow_service_never_delays_a_scrape(start_daemon: StartDaemon, fake: FakeLibtpu) -> None:
    daemon = serve(start_daemon, fake.address)
    daemon.wait_for(lambda s: len(tpu_devices(s)) == 4, what="four TPU devices")
    fake.update(delay=3.0)
    # Every scrape answers from the snapshot within the client's 1 s timeout while each poll waits on the service.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert daemon.get("/metrics", timeout=1.0).status_code == 200
    samples = daemon.wait_for(lambda s: success(s) == 0, what="polls cut at the deadline")
    assert not tpu_devices(samples)
    fake.update(delay=0.0)
    daemon.wait_for(lambda s: success(s) == 1, what="fast again")


def multislice_host() -> dict[str, list[Entry]]:
    """Every megascale metric of a multi-slice host: the sized ones with 600 + 400 transfers of 8MB+ in [1,2) and
    [2,4) ms (two streams) and 100 of 1MB+ in [1,2) ms; the gRPC ones over 2 connections."""
    host = {}
    for name in MEGASCALE:
        if "grpc_tcp" in name:
            host[name] = [connection(c, [0, 300, 200, 0], scale=50.0, mean=80.0) for c in range(2)]
        else:
            host[name] = [
                sized("8MB+", [0, 600, 0, 0], stream=0, scale=1000.0, mean=1500.0),
                sized("8MB+", [0, 0, 400, 0], stream=1, scale=1000.0, mean=3000.0),
                sized("1MB+", [0, 100, 0, 0], stream=0, scale=1000.0, mean=1200.0),
            ]
    return host


def megascale_series(samples: Samples) -> set[str]:
    return {name for name, _ in samples if name.startswith("jaxmon_megascale_")}


def test_the_sidecar_serves_the_idle_duration_and_the_megascale_summaries_of_a_multislice_job(
    start_daemon: StartDaemon,
) -> None:
    scenario = Scenario(chips=chips(), host=multislice_host())
    for i, chip in enumerate(scenario.chips.values()):
        chip.idle_s = 3.25 * i
    server = FakeLibtpu(scenario).start()
    try:
        daemon = serve(start_daemon, server.address)
        samples = daemon.wait_for(lambda s: len(megascale_series(s)) == 24, what="eight megascale summaries")
        assert success(samples) == 1
        for i, dev in enumerate(IDS):
            assert sample(samples, "jaxmon_device_tensorcore_idle_duration_seconds", **labels(dev)) == 3.25 * i
        families = ("dcn", "dcn_inbound", "host_to_device", "device_to_host")
        sized_families = [f"jaxmon_megascale_{f}_transfer_latency_seconds" for f in families] + [
            "jaxmon_megascale_collective_end_to_end_latency_seconds",
            "jaxmon_megascale_host_compute_latency_seconds",
        ]
        for family in sized_families:
            big = {"source": "libtpu", "buffer_size": "8MB+"}
            # 1000 transfers: 600 in [1,2) ms and 400 in [2,4) ms. p50 (rank 500) is the 500th of the 600 in
            # [1,2) ms; p90 (rank 900) the 300th of the 400 in [2,4) ms.
            assert sample(samples, family, **big, quantile="0.5") == pytest.approx((1 + 500 / 600) * 1e-3), family
            assert sample(samples, family, **big, quantile="0.9") == pytest.approx((2 + 2 * 300 / 400) * 1e-3)
            assert sample(samples, family + "_count", **big) == 1000
            assert sample(samples, family + "_sum", **big) == pytest.approx(600 * 1.5e-3 + 400 * 3e-3)
            small = {"source": "libtpu", "buffer_size": "1MB+"}
            assert sample(samples, family, **small, quantile="0.5") == pytest.approx(1.5e-3)
            assert sample(samples, family + "_sum", **small) == pytest.approx(100 * 1.2e-3)
        # gRPC: two connections of [0, 300, 200, 0] summed over [0,50) [50,100) [100,200) [200,inf): p50 (rank 500)
        # is the 500th of the 600 in [50, 100).
        rtt, rate = (
            "jaxmon_megascale_grpc_tcp_min_rtt_seconds",
            "jaxmon_megascale_grpc_tcp_delivery_rate_bytes_per_second",
        )
        assert sample(samples, rtt, source="libtpu", quantile="0.5") == pytest.approx((50 + 50 * 500 / 600) * 1e-6)
        assert sample(samples, rtt + "_count", source="libtpu") == 1000
        assert sample(samples, rate, source="libtpu", quantile="0.5") == pytest.approx((50 + 50 * 500 / 600) * 125_000)
        assert sample(samples, rate + "_sum", source="libtpu") == pytest.approx(1000 * 80 * 125_000)

        # The collector's exposition passes Prometheus's lint (summaries included), and every family it exports is
        # in the README's metrics reference.
        r = daemon.get("/metrics", params={"collect[]": "tpu"})
        lint = subprocess.run(
            [promtool(), "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=30
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
        exported = {name for name, _ in parse_samples(r.text)}
        assert exported - set(readme_metrics()) == set()

        # A restarted libtpu whose job runs on one slice: the megascale series go, the rest stay.
        server.update(failing=dict.fromkeys(MEGASCALE, grpc.StatusCode.NOT_FOUND))
        samples = daemon.wait_for(lambda s: not megascale_series(s), what="no megascale series")
        assert success(samples) == 1
        assert sample(samples, "jaxmon_device_tensorcore_idle_duration_seconds", **labels(13)) == 9.75
        # Said once per change of what is not served, not once per poll: a poll that read some metrics before the
        # restart and some after may say a part of them first.
        said = [line for line in daemon.log().splitlines() if "libtpu does not serve these metrics here" in line]
        assert 1 <= len(said) <= 2 and all(name in said[-1] for name in MEGASCALE), said
        wait_for_fresh_samples(daemon.url, "tpu")
        wait_for_fresh_samples(daemon.url, "tpu")
        assert daemon.log().count("libtpu does not serve these metrics here") == len(said)
    finally:
        server.stop()


def test_a_single_slice_libtpu_that_lists_no_megascale_metric_is_not_asked_for_them(
    start_daemon: StartDaemon,
) -> None:
    server = FakeLibtpu(Scenario(chips=chips(), host=multislice_host(), supported=served_without(MEGASCALE))).start()
    try:
        daemon = serve(start_daemon, server.address)
        daemon.wait_for(lambda s: len(tpu_devices(s)) == 4, what="four TPU devices")
        time.sleep(1.0)  # a few more polls
        samples = daemon.scrape()
        assert success(samples) == 1
        assert not megascale_series(samples)
        assert not MEGASCALE & set(server.scenario.requested)
        # Said once per change of what is not served, not once per poll: a poll that read some metrics before the
        # restart and some after may say a part of them first.
        said = [line for line in daemon.log().splitlines() if "libtpu does not serve these metrics here" in line]
        assert 1 <= len(said) <= 2 and all(name in said[-1] for name in MEGASCALE), said
        wait_for_fresh_samples(daemon.url, "tpu")
        wait_for_fresh_samples(daemon.url, "tpu")
        assert daemon.log().count("libtpu does not serve these metrics here") == len(said)
    finally:
        server.stop()
