"""A libtpu runtime metrics service on loopback, built on tpu-info's own stubs, serving what a test writes.

It speaks the real protocol: the servicer base class and messages are tpu-info's generated ones, the metric names
are `tpu_info.metrics.MetricName`'s, and the attribute shapes are those tpu-info's client reads (`device-id` as an
int attribute for memory, duty cycle, HBM bandwidth and idle duration; a key/value list with `device_ordinal` for HLO
metrics; a key/value list with `buffer-size` for the megascale distributions, or only the size as its first
attribute in older libtpu). Runs in the test process (or a benchmark's child) on its own gRPC threads, with
`grpc.local_server_credentials()` as libtpu's local service.

The megascale metrics are per host: `Scenario.host` holds each one's entries, each a distribution with exponential
buckets as tpu-info's `get_transfer_latency` reads them. Besides the buffer size, libtpu's entries carry other
attributes that tell its connections or streams apart, which tpu-info sums over and does not document; the fake's
entries carry whatever attributes a test gives (`Entry.attributes`, in order).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from tpu_info.metrics import MetricName
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc


@dataclass
class Timing:
    """An HLO execution time distribution: exponential buckets (µs), bucket 0 the underflow."""

    counts: list[int]
    scale: float = 1.0
    growth: float = 2.0
    mean_us: float = 0.0


@dataclass
class Entry:
    """One entry of a megascale distribution: its key/value attributes in the order sent (a string or an int value
    each), exponential buckets (bucket 0 the underflow, the last the overflow) and the mean, in the metric's unit
    (µs, or Mbps for the delivery rate). `as_summary` sends a Summary of quantiles instead of a distribution: a
    shape tpu-info does not read."""

    counts: list[int]
    attributes: tuple[tuple[str, str | int], ...] = ()
    scale: float = 1.0
    growth: float = 2.0
    mean: float = 0.0
    as_summary: bool = False


def sized(size: str, counts: list[int], stream: int = 0, **kw: Any) -> Entry:
    """An entry as newer libtpu sends a sized one: `buffer-size` beside another attribute (here `stream`)."""
    return Entry(counts, attributes=(("stream", stream), ("buffer-size", size)), **kw)


def connection(conn: int, counts: list[int], **kw: Any) -> Entry:
    """A gRPC TCP entry of one connection (told apart by an int attribute; no buffer size)."""
    return Entry(counts, attributes=(("connection", conn),), **kw)


# Every megascale metric (per host), and the names tpu-info knows.
MEGASCALE = frozenset(m.value for m in MetricName if m.value.startswith("megascale."))
ALL_NAMES = frozenset(m.value for m in MetricName)


def served_without(names: set[str] | frozenset[str]) -> set[str]:
    """A listing (Scenario.supported) of every name tpu-info knows but `names`: a libtpu that serves none of them."""
    return set(ALL_NAMES - names)


@dataclass
class Chip:
    """What libtpu reports for one device-id; None leaves the device out of that metric."""

    total_bytes: int | None = 16 << 30
    used_bytes: int | None = 0
    duty_cycle_pct: float | None = 0.0
    hbm_util_pct: float | None = None
    idle_s: float | None = None
    hlo_queue: int | None = None
    timing: Timing | None = None


@dataclass
class Scenario:
    """The service's state; tests mutate it through `FakeLibtpu.update` (under its lock)."""

    chips: dict[int, Chip] = field(default_factory=dict)
    # The host's megascale distributions: metric name -> its entries (a listed name without entries answers none).
    host: dict[str, list[Entry]] = field(default_factory=dict)
    # Metric names ListSupportedMetrics returns; None serves every name tpu-info knows.
    supported: set[str] | None = None
    # False: an older libtpu whose ListSupportedMetrics is UNIMPLEMENTED (it still refuses unsupported names).
    listing: bool = True
    # Answer every call with this status (e.g. UNAVAILABLE) instead of data.
    status: grpc.StatusCode | None = None
    # Answer GetRuntimeMetric for these names with these statuses (a listed metric that fails).
    failing: dict[str, grpc.StatusCode] = field(default_factory=dict)
    # Seconds to wait before answering (a slow service).
    delay: float = 0.0
    # HLO metrics' device_ordinal as a string (newer libtpu) or an int (older libtpu).
    ordinal_as_string: bool = True
    calls: int = 0
    # The metric names GetRuntimeMetric was asked for, in order.
    requested: list[str] = field(default_factory=list)


class _Servicer(pb_grpc.RuntimeMetricServiceServicer):  # type: ignore[misc]  # tpu-info ships no py.typed
    def __init__(self, fake: FakeLibtpu) -> None:
        self.fake = fake

    def _begin(self, context: Any) -> Scenario:
        with self.fake.lock:
            self.fake.scenario.calls += 1
            delay, status = self.fake.scenario.delay, self.fake.scenario.status
        if delay:
            time.sleep(delay)
        if status is not None:
            context.abort(status, f"fake libtpu answers {status.name}")
        return self.fake.scenario

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:
        scenario = self._begin(context)
        if not scenario.listing:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListSupportedMetrics is not implemented")
        with self.fake.lock:
            names = sorted(scenario.supported if scenario.supported is not None else {m.value for m in MetricName})
        return pb.ListSupportedMetricsResponse(supported_metric=[pb.SupportedMetric(metric_name=n) for n in names])

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:
        with self.fake.lock:
            self.fake.scenario.requested.append(request.metric_name)
        scenario = self._begin(context)
        name = request.metric_name
        with self.fake.lock:
            if scenario.supported is not None and name not in scenario.supported:
                context.abort(grpc.StatusCode.NOT_FOUND, f"metric {name} not supported")
            if name in scenario.failing:
                context.abort(scenario.failing[name], f"fake libtpu fails {name}")
            if name in MEGASCALE:
                metrics = [_host_metric(entry) for entry in scenario.host.get(name, [])]
            else:
                metrics = [
                    m for dev, chip in sorted(scenario.chips.items()) if (m := _metric(name, dev, chip, scenario))
                ]
        return pb.MetricResponse(metric=pb.TPUMetric(name=name, description="fake", metrics=metrics))


def _device_attr(dev: int) -> Any:
    return pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=dev))


def _ordinal_attr(dev: int, as_string: bool) -> Any:
    ordinal = pb.AttrValue(string_attr=str(dev)) if as_string else pb.AttrValue(int_attr=dev)
    kv = pb.KeyValueList(
        attributes=[
            pb.Attribute(key="device_ordinal", value=ordinal),
            pb.Attribute(key="core_type", value=pb.AttrValue(string_attr="tensor_core")),
        ]
    )
    return pb.Attribute(value=pb.AttrValue(kvlist_attr=kv))


def _attr_value(value: str | int) -> Any:
    return pb.AttrValue(int_attr=value) if isinstance(value, int) else pb.AttrValue(string_attr=value)


def _host_metric(entry: Entry) -> Any:
    kv = pb.KeyValueList(attributes=[pb.Attribute(key=k, value=_attr_value(v)) for k, v in entry.attributes])
    attribute = pb.Attribute(value=pb.AttrValue(kvlist_attr=kv))
    if entry.as_summary:
        summary = pb.Summary(
            sample_count=sum(entry.counts),
            sample_sum=sum(entry.counts) * entry.mean,
            quantile=[pb.Quantile(quantile=0.5, value=entry.mean)],
        )
        return pb.Metric(attribute=attribute, summary=summary)
    dist = _distribution(entry.counts, entry.scale, entry.growth, entry.mean)
    return pb.Metric(attribute=attribute, distribution=dist)


def _distribution(counts: list[int], scale: float, growth: float, mean: float) -> Any:
    return pb.Distribution(
        count=sum(counts),
        mean=mean,
        bucket_options=pb.Distribution.BucketOptions(
            exponential_buckets=pb.Distribution.BucketOptions.Exponential(
                num_finite_buckets=len(counts) - 2, growth_factor=growth, scale=scale
            )
        ),
        bucket_counts=counts,
    )


def _metric(name: str, dev: int, chip: Chip, scenario: Scenario) -> Any:
    """One device's `Metric` for `name`, or None when the scenario leaves it out."""
    if name == MetricName.TOTAL_MEMORY.value and chip.total_bytes is not None:
        return pb.Metric(attribute=_device_attr(dev), gauge=pb.Gauge(as_int=chip.total_bytes))
    if name == MetricName.MEMORY_USAGE.value and chip.used_bytes is not None:
        return pb.Metric(attribute=_device_attr(dev), gauge=pb.Gauge(as_int=chip.used_bytes))
    if name == MetricName.DUTY_CYCLE_PCT.value and chip.duty_cycle_pct is not None:
        return pb.Metric(attribute=_device_attr(dev), gauge=pb.Gauge(as_double=chip.duty_cycle_pct))
    if name == MetricName.HBM_BW_UTIL.value and chip.hbm_util_pct is not None:
        return pb.Metric(attribute=_device_attr(dev), gauge=pb.Gauge(as_double=chip.hbm_util_pct))
    if name == MetricName.TENSORCORE_IDLE_DURATION.value and chip.idle_s is not None:
        return pb.Metric(attribute=_device_attr(dev), gauge=pb.Gauge(as_double=chip.idle_s))
    if name == MetricName.HLO_QUEUE_SIZE.value and chip.hlo_queue is not None:
        return pb.Metric(
            attribute=_ordinal_attr(dev, scenario.ordinal_as_string), gauge=pb.Gauge(as_int=chip.hlo_queue)
        )
    if name == MetricName.HLO_EXECUTION_TIMING_DISTRIBUTION_MICROSECONDS.value and chip.timing is not None:
        t = chip.timing
        dist = _distribution(t.counts, t.scale, t.growth, t.mean_us)
        return pb.Metric(attribute=_ordinal_attr(dev, scenario.ordinal_as_string), distribution=dist)
    return None


class FakeLibtpu:
    """The service on 127.0.0.1: `start()`, `stop()` (nothing listening), `start()` again on the same port."""

    def __init__(self, scenario: Scenario | None = None, port: int = 0) -> None:
        self.lock = threading.Lock()
        self.scenario = scenario or Scenario()
        self.port = port
        self._server: Any = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeLibtpu:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(_Servicer(self), server)
        self.port = server.add_secure_port(f"127.0.0.1:{self.port}", grpc.local_server_credentials())
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def update(self, **changes: Any) -> None:
        """Change scenario fields at once, e.g. `update(status=grpc.StatusCode.UNAVAILABLE)`."""
        with self.lock:
            for key, value in changes.items():
                setattr(self.scenario, key, value)

    def set_chip(self, dev: int, chip: Chip | None) -> None:
        """Replace one device's values, or drop it (None) from every response."""
        with self.lock:
            if chip is None:
                self.scenario.chips.pop(dev, None)
            else:
                self.scenario.chips[dev] = chip
