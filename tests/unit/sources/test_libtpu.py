"""The libtpu source (jaxmon/sources/libtpu/) without a service: libtpu's messages (tpu-info's generated protobuf
classes, built here as libtpu sends them) turned into device ids, gauges, HLO timing quantiles and the host's
megascale distributions.

The client against a real gRPC service on loopback (tests/fake_libtpu.py) is tests/e2e/collectors/test_tpu.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from tpu_info.proto import tpu_metric_service_pb2 as pb

from jaxmon.sources.libtpu import names
from jaxmon.sources.libtpu.names import HostDistribution
from jaxmon.sources.libtpu.parse import (
    NO_BUFFER_SIZE,
    bucket_bounds,
    bucket_quantile,
    device_id,
    gauges,
    summaries,
    timings,
)

Buckets = pb.Distribution.BucketOptions


def device_attr(dev: int, key: str = "device-id") -> Any:
    """Memory and duty cycle name their device by an int attribute `device-id`."""
    return pb.Attribute(key=key, value=pb.AttrValue(int_attr=dev))


def ordinal_attr(ordinal: pb.AttrValue) -> Any:
    """HLO metrics name theirs in a key/value list, `device_ordinal` beside other keys."""
    kv = pb.KeyValueList(
        attributes=[
            pb.Attribute(key="core_type", value=pb.AttrValue(string_attr="tensor_core")),
            pb.Attribute(key="device_ordinal", value=ordinal),
        ]
    )
    return pb.Attribute(value=pb.AttrValue(kvlist_attr=kv))


def test_the_device_is_read_from_either_attribute_shape_and_nothing_else_is_guessed() -> None:
    assert device_id(device_attr(12)) == 12
    assert device_id(ordinal_attr(pb.AttrValue(string_attr="9"))) == 9  # newer libtpu: a string
    assert device_id(ordinal_attr(pb.AttrValue(int_attr=13))) == 13  # older libtpu: an int
    assert device_id(device_attr(12, key="chip-id")) is None  # another key is not the device
    assert device_id(ordinal_attr(pb.AttrValue(string_attr="tensor_core"))) is None
    assert device_id(pb.Attribute(key="device-id", value=pb.AttrValue(string_attr="12"))) is None


def test_gauges_are_per_device_int_or_double_and_a_metric_without_a_device_is_left_out() -> None:
    metrics = [
        pb.Metric(attribute=device_attr(8), gauge=pb.Gauge(as_int=17179869184)),
        pb.Metric(attribute=device_attr(9), gauge=pb.Gauge(as_double=37.5)),
        pb.Metric(attribute=device_attr(10, key="chip-id"), gauge=pb.Gauge(as_int=1)),
        pb.Metric(attribute=device_attr(11)),  # no value at all
    ]
    assert gauges(metrics) == {8: 17179869184.0, 9: 37.5}


def exponential(counts: list[int], mean_us: float, dev: int = 8) -> Any:
    """An HLO timing distribution as libtpu sends it: exponential buckets (µs), bucket 0 the underflow."""
    options = Buckets(
        exponential_buckets=Buckets.Exponential(num_finite_buckets=len(counts) - 2, growth_factor=2.0, scale=1.0)
    )
    dist = pb.Distribution(count=sum(counts), mean=mean_us, bucket_options=options, bucket_counts=counts)
    return pb.Metric(attribute=ordinal_attr(pb.AttrValue(string_attr=str(dev))), distribution=dist)


def test_hlo_timings_are_the_distributions_mean_and_interpolated_quantiles_in_seconds() -> None:
    # 1000 executions over [1,2) [2,4) [4,8) [8,16) µs and 5 in the overflow bucket (16 µs and up).
    (timing,) = timings([exponential([0, 100, 400, 300, 195, 5], mean_us=4.0)]).items()
    dev, t = timing
    assert (dev, t.count) == (8, 1000)
    assert t.mean_seconds == pytest.approx(4e-6)
    quantiles = dict(t.quantiles)
    assert set(quantiles) == {0.5, 0.9, 0.95, 0.999}
    # p50: rank 500 is the last of the 400 in [2,4) µs. p90: 800 lie below 8 µs, rank 900 is the 100th of the 195
    # in [8,16). p99.9 lies in the overflow bucket: its lower bound, never an invented upper one.
    assert quantiles[0.5] == pytest.approx(4e-6)
    assert quantiles[0.9] == pytest.approx((8 + 8 * 100 / 195) * 1e-6)
    assert quantiles[0.999] == pytest.approx(16e-6)


def test_a_device_with_no_executions_yet_has_no_timing() -> None:
    assert timings([exponential([0, 0, 0, 0], mean_us=0.0)]) == {}


def test_bucket_bounds_follow_the_distribution_layout_of_each_bucket_kind() -> None:
    exp = Buckets(exponential_buckets=Buckets.Exponential(num_finite_buckets=2, growth_factor=2.0, scale=1000.0))
    assert bucket_bounds(exp, 4) == [(0.0, 1000.0), (1000.0, 2000.0), (2000.0, 4000.0), (4000.0, math.inf)]
    linear = Buckets(linear_buckets=Buckets.Linear(num_finite_buckets=2, width=5.0, offset=10.0))
    assert bucket_bounds(linear, 4) == [(0.0, 10.0), (10.0, 15.0), (15.0, 20.0), (20.0, math.inf)]
    explicit = Buckets(explicit_buckets=Buckets.Explicit(bounds=[1.0, 3.0]))
    assert bucket_bounds(explicit, 3) == [(0.0, 1.0), (1.0, 3.0), (3.0, math.inf)]
    assert bucket_bounds(explicit, 5) is None  # fewer bounds than the counts need: not guessed
    assert bucket_bounds(Buckets(), 3) is None  # no layout at all


def test_a_quantile_is_interpolated_inside_its_bucket() -> None:
    bounds = [(0.0, 10.0), (10.0, 20.0), (20.0, math.inf)]
    assert bucket_quantile(0.5, [0, 10, 0], bounds) == pytest.approx(15.0)  # halfway through [10, 20)
    assert bucket_quantile(0.25, [5, 5, 0], bounds) == pytest.approx(5.0)
    assert bucket_quantile(1.0, [5, 5, 0], bounds) == pytest.approx(20.0)
    assert bucket_quantile(0.9, [0, 1, 9], bounds) == 20.0  # in the overflow bucket: its lower bound


# --------------------------------------------------------------------------------------------------------------
# The megascale distributions (per host): grouped by buffer size and summed as tpu-info's get_transfer_latency does
# --------------------------------------------------------------------------------------------------------------

DCN = HostDistribution(names.DCN_TRANSFER, names.MICROSECONDS, by_buffer_size=True)
RTT = HostDistribution(names.GRPC_TCP_MIN_RTT, names.MICROSECONDS, by_buffer_size=False)
RATE = HostDistribution(names.GRPC_TCP_DELIVERY_RATE, names.MEGABITS_PER_SECOND, by_buffer_size=False)


def kv(*attributes: tuple[str, str | int]) -> Any:
    """A key/value list attribute, as libtpu labels its megascale entries."""
    values = [pb.AttrValue(int_attr=v) if isinstance(v, int) else pb.AttrValue(string_attr=v) for _, v in attributes]
    pairs = [pb.Attribute(key=k, value=v) for (k, _), v in zip(attributes, values, strict=True)]
    return pb.Attribute(value=pb.AttrValue(kvlist_attr=pb.KeyValueList(attributes=pairs)))


def entry(attribute: Any, counts: list[int], mean: float, scale: float = 1000.0, finite: int | None = None) -> Any:
    """A megascale entry: exponential buckets from `scale` (growth 2), bucket 0 the underflow."""
    options = Buckets(
        exponential_buckets=Buckets.Exponential(
            num_finite_buckets=len(counts) - 2 if finite is None else finite, growth_factor=2.0, scale=scale
        )
    )
    dist = pb.Distribution(count=sum(counts), mean=mean, bucket_options=options, bucket_counts=counts)
    return pb.Metric(attribute=attribute, distribution=dist)


def test_entries_of_a_buffer_size_are_summed_bucket_by_bucket_and_read_in_seconds() -> None:
    # Two streams of 8MB+ transfers and one of 4MB+: buckets [0,1) [1,2) [2,4) [4,8) [8,16) [16,inf) ms.
    metrics = [
        entry(kv(("stream", 0), ("buffer-size", "8MB+")), [0, 10, 30, 40, 20, 0], mean=3000.0),
        entry(kv(("stream", 1), ("buffer-size", "8MB+")), [0, 0, 10, 50, 40, 0], mean=5000.0),
        entry(kv(("stream", 0), ("buffer-size", "4MB+")), [0, 100, 0, 0, 0, 0], mean=1500.0),
    ]
    small, big = summaries(metrics, DCN)
    assert (big.buffer_size, big.count, small.buffer_size, small.count) == ("8MB+", 200, "4MB+", 100)
    # The sum of count x mean: 100 x 3 ms + 100 x 5 ms.
    assert big.total == pytest.approx(0.8)
    assert small.total == pytest.approx(0.15)
    # Summed buckets [0, 10, 40, 90, 60, 0]: rank 100 is the 50th of the 90 in [4, 8) ms; ranks 180, 190 and 199.8
    # are the 40th, 50th and 59.8th of the 60 in [8, 16) ms. Never an average of the two streams' quantiles.
    q = dict(big.quantiles)
    assert q[0.5] == pytest.approx((4 + 4 * 50 / 90) * 1e-3)
    assert q[0.9] == pytest.approx((8 + 8 * 40 / 60) * 1e-3)
    assert q[0.95] == pytest.approx((8 + 8 * 50 / 60) * 1e-3)
    assert q[0.999] == pytest.approx((8 + 8 * 59.8 / 60) * 1e-3)
    assert dict(small.quantiles)[0.5] == pytest.approx(1.5e-3)  # halfway through [1, 2) ms


def test_the_buffer_size_is_read_as_tpu_info_reads_it() -> None:
    counts = [0, 4, 0]
    metrics = [
        entry(kv(("buffer-size", "1MB+")), counts, mean=1.0),
        entry(kv(("size", "2MB+")), counts, mean=1.0),  # older libtpu: the size is the first attribute
        entry(kv(("stream", 3)), counts, mean=1.0),  # no string to group by: N/A
        entry(pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=4)), counts, mean=1.0),  # no list: N/A
        entry(kv(("buffer-size", "")), counts, mean=1.0),  # an empty size: N/A too
    ]
    got = {s.buffer_size: s.count for s in summaries(metrics, DCN)}
    assert got == {"1MB+": 4, "2MB+": 4, NO_BUFFER_SIZE: 12}


def test_grpc_tcp_distributions_sum_every_connection_of_the_host() -> None:
    metrics = [
        entry(kv(("connection", 0)), [0, 3, 1, 0], mean=1200.0, scale=10.0),
        entry(kv(("connection", 1), ("buffer-size", "8MB+")), [0, 1, 3, 0], mean=1800.0, scale=10.0),
    ]
    (rtt,) = summaries(metrics, RTT)
    assert (rtt.buffer_size, rtt.count) == (None, 8)
    assert rtt.total == pytest.approx((4 * 1200 + 4 * 1800) * 1e-6)
    # Summed [0, 4, 4, 0] over [0,10) [10,20) [20,40) [40,inf) µs: the median is the top of [10, 20).
    assert dict(rtt.quantiles)[0.5] == pytest.approx(20e-6)
    (rate,) = summaries(metrics, RATE)  # the delivery rate is in Mbps: bytes per second are x 1e6 / 8
    assert dict(rate.quantiles)[0.5] == pytest.approx(20 * 125_000)
    assert rate.total == pytest.approx((4 * 1200 + 4 * 1800) * 125_000)


def test_entries_that_cannot_be_summed_or_read_are_left_out() -> None:
    summary = pb.Metric(
        attribute=kv(("buffer-size", "8MB+")),
        summary=pb.Summary(sample_count=5, sample_sum=10.0, quantile=[pb.Quantile(quantile=0.5, value=2.0)]),
    )
    gauge = pb.Metric(attribute=kv(("buffer-size", "8MB+")), gauge=pb.Gauge(as_double=3.0))
    no_layout = pb.Metric(
        attribute=kv(("buffer-size", "8MB+")), distribution=pb.Distribution(count=2, mean=1.0, bucket_counts=[1, 1])
    )
    other_layout = entry(kv(("buffer-size", "8MB+")), [0, 7, 0], mean=1.0, scale=5.0)
    kept = entry(kv(("buffer-size", "8MB+")), [0, 2, 0], mean=1.0)
    (s,) = summaries([summary, gauge, no_layout, kept, other_layout], DCN)
    assert s.count == 2  # only the entry with the group's layout
    assert summaries([summary, gauge, no_layout], DCN) == ()


def test_trailing_empty_buckets_left_out_of_an_entry_are_padded_to_the_layout() -> None:
    # The layout declares 4 finite buckets (6 in all); the entry sends the first 3 counts. Its last count is the
    # finite bucket [2, 4) ms, not the overflow (whose lower bound, 2 ms, the median would be): it interpolates.
    (s,) = summaries([entry(kv(("buffer-size", "8MB+")), [0, 0, 10], mean=3000.0, finite=4)], DCN)
    assert dict(s.quantiles)[0.5] == pytest.approx(3e-3)


def test_a_distribution_with_no_samples_yet_has_a_count_of_0_and_no_quantiles() -> None:
    (s,) = summaries([entry(kv(("buffer-size", "8MB+")), [0, 0, 0, 0], mean=0.0)], DCN)
    assert (s.count, s.total, s.quantiles) == (0, 0.0, ())


def test_the_idle_duration_is_a_device_gauge_like_the_duty_cycle() -> None:
    assert gauges([pb.Metric(attribute=device_attr(8), gauge=pb.Gauge(as_double=12.5))]) == {8: 12.5}
