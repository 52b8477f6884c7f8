"""The libtpu source (jaxmon/sources/libtpu/) without a service: libtpu's messages (tpu-info's generated protobuf
classes, built here as libtpu sends them) turned into device ids, gauges and HLO timing quantiles.

The client against a real gRPC service on loopback (tests/fake_libtpu.py) is tests/e2e/collectors/test_tpu.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from tpu_info.proto import tpu_metric_service_pb2 as pb

from jaxmon.sources.libtpu.parse import bucket_bounds, bucket_quantile, device_id, gauges, timings

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
