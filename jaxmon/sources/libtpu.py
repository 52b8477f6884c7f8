"""libtpu's runtime metrics service, read the way tpu-info reads it: no access to the chips, only gRPC on loopback.

The training process's libtpu serves `tpu.monitoring.runtime.RuntimeMetricService` (default `localhost:8431`).
jaxmon uses tpu-info's generated stubs and metric names (`tpu_info.proto`, `tpu_info.metrics.MetricName`), but not
its client functions: those open a new channel per call and set no deadline (tpu_info/metrics.py,
`get_chip_usage_new`), and a poll here must be bounded. So: one long-lived channel with tpu-info's credentials
(`grpc.local_channel_credentials()`), every call with a deadline, all calls of a poll in flight at once.

grpc and tpu_info are imported when a client is made, never at jaxmon import time (`jaxmon --help` stays fast).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Metric keys jaxmon reads, and libtpu's names for them (tpu_info.metrics.MetricName; checked at client start).
TOTAL = "tpu.runtime.hbm.memory.total.bytes"
USAGE = "tpu.runtime.hbm.memory.usage.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_UTILIZATION = "tpu.runtime.hbm.utilization.percent"
HLO_QUEUE = "hlo.queue.size.gauge"
HLO_TIMING = "hlo.execution.timing.distribution.microseconds"
# Served by every libtpu that has the service: a poll without them has failed. The others only where served.
CORE = (TOTAL, USAGE, DUTY_CYCLE)
OPTIONAL = (HBM_UTILIZATION, HLO_QUEUE, HLO_TIMING)
QUANTILES = (0.5, 0.9, 0.95, 0.999)


class LibtpuUnavailable(Exception):
    """The service did not answer a core metric: nothing listening, too slow, or an error status."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Timing:
    """HLO execution time of one device, from libtpu's distribution: mean and quantiles, in seconds."""

    count: int
    mean_seconds: float
    quantiles: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class LibtpuReading:
    """One poll: per metric, the value of each device-id that libtpu answered for."""

    gauges: Mapping[str, Mapping[int, float]]
    timings: Mapping[int, Timing] = field(default_factory=dict)
    # Optional metrics this libtpu lists but that failed this poll (name -> status): the poll is partial.
    failed: Mapping[str, str] = field(default_factory=dict)


class LibtpuClient:
    """One channel to the service; `poll()` reads every metric jaxmon reports, bounded by `timeout` seconds."""

    def __init__(self, address: str, timeout: float, max_reconnect_backoff: float) -> None:
        import grpc
        from tpu_info.metrics import MetricName
        from tpu_info.proto import tpu_metric_service_pb2 as pb
        from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

        served_names = {m.value for m in MetricName}
        missing = [name for name in (*CORE, *OPTIONAL) if name not in served_names]
        if missing:  # tpu-info renamed a metric: fail loudly rather than report nothing.
            raise RuntimeError(f"tpu-info no longer names these libtpu metrics: {missing}")
        self.address = address
        self.timeout = timeout
        self._grpc: Any = grpc
        self._pb: Any = pb
        # gRPC backs off up to 120 s between reconnects by default; a service that appears (training starts) must be
        # seen within a poll or two, so the backoff is capped (a refused connect on loopback costs microseconds).
        backoff_ms = max(100, int(max_reconnect_backoff * 1000))
        self._channel: Any = grpc.secure_channel(
            address,
            grpc.local_channel_credentials(),
            options=[
                ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
                ("grpc.min_reconnect_backoff_ms", min(1000, backoff_ms)),
                ("grpc.max_reconnect_backoff_ms", backoff_ms),
            ],
        )
        self._stub: Any = pb_grpc.RuntimeMetricServiceStub(self._channel)
        # What this libtpu serves (ListSupportedMetrics), asked once per connection; None until then.
        self._supported: frozenset[str] | None = None
        # False when this libtpu cannot list its metrics: then an optional metric it refuses is taken as not served.
        self._listed = True

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def poll(self) -> LibtpuReading:
        """Every metric, all calls at once; raises LibtpuUnavailable when a core metric is not answered."""
        deadline = time.monotonic() + self.timeout
        try:
            supported = self._supported_metrics(deadline)
        except LibtpuUnavailable:
            self._supported = None
            raise
        wanted = [*CORE, *(name for name in OPTIONAL if name in supported)]
        futures = {
            name: self._stub.GetRuntimeMetric.future(self._request(name), timeout=self._left(deadline))
            for name in wanted
        }
        responses: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for name, future in futures.items():
            try:
                responses[name] = future.result()
            except self._grpc.RpcError as exc:
                if not self._listed and name not in CORE and exc.code() in self._not_served():
                    continue
                failed[name] = exc.code().name
                if name in CORE:
                    for other in futures.values():
                        other.cancel()
                    self._supported = None
                    raise LibtpuUnavailable(exc.code().name, exc.details() or "") from None
        return LibtpuReading(
            gauges={name: _gauges(responses[name].metric.metrics) for name in responses if name != HLO_TIMING},
            timings=_timings(responses[HLO_TIMING].metric.metrics) if HLO_TIMING in responses else {},
            failed=failed,
        )

    def _supported_metrics(self, deadline: float) -> frozenset[str]:
        if self._supported is not None:
            return self._supported
        try:
            response = self._stub.ListSupportedMetrics(
                self._pb.ListSupportedMetricsRequest(), timeout=self._left(deadline)
            )
        except self._grpc.RpcError as exc:
            if exc.code() != self._grpc.StatusCode.UNIMPLEMENTED:
                raise LibtpuUnavailable(exc.code().name, exc.details() or "") from None
            # An older libtpu without the listing: ask for everything, and take a refused optional metric as absent.
            self._listed = False
            self._supported = frozenset(OPTIONAL)
            return self._supported
        self._listed = True
        self._supported = frozenset(m.metric_name for m in response.supported_metric)
        return self._supported

    def _not_served(self) -> tuple[Any, ...]:
        """Statuses with which a libtpu that cannot list its metrics refuses one it does not serve."""
        code = self._grpc.StatusCode
        return (code.NOT_FOUND, code.UNIMPLEMENTED, code.INVALID_ARGUMENT)

    def _request(self, name: str) -> Any:
        return self._pb.MetricRequest(metric_name=name)

    def _left(self, deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())


def _gauges(metrics: Iterable[Any]) -> dict[int, float]:
    """device-id -> value, from `Metric`s whose attribute is `device-id` (int) or a key/value list (HLO metrics)."""
    out: dict[int, float] = {}
    for m in metrics:
        device = device_id(m.attribute)
        if device is None:
            continue
        gauge = m.gauge
        kind = gauge.WhichOneof("value")
        if kind == "as_int":
            out[device] = float(gauge.as_int)
        elif kind == "as_double":
            out[device] = float(gauge.as_double)
    return out


def device_id(attribute: Any) -> int | None:
    """The device of a metric: `device-id` as int_attr (memory, duty cycle), or `device_ordinal` in a kvlist.

    HLO metrics carry a key/value list with `device_ordinal`, a string in newer libtpu and an int in older ones
    (tpu_info/metrics.py, `get_hlo_queue_size`).
    """
    value = attribute.value
    kind = value.WhichOneof("attr")
    if kind == "int_attr" and attribute.key == "device-id":
        return int(value.int_attr)
    if kind == "kvlist_attr":
        for attr in value.kvlist_attr.attributes:
            if attr.key != "device_ordinal":
                continue
            inner = attr.value.WhichOneof("attr")
            if inner == "int_attr":
                return int(attr.value.int_attr)
            if inner == "string_attr" and attr.value.string_attr.isdigit():
                return int(attr.value.string_attr)
    return None


def _timings(metrics: Iterable[Any]) -> dict[int, Timing]:
    out: dict[int, Timing] = {}
    for m in metrics:
        device = device_id(m.attribute)
        dist = m.distribution
        if device is None or dist.count <= 0:  # no executions yet: nothing to report (never a made-up 1.0)
            continue
        bounds = _bucket_bounds(dist.bucket_options, len(dist.bucket_counts))
        if bounds is None:
            continue
        counts = list(dist.bucket_counts)
        out[device] = Timing(
            count=int(dist.count),
            mean_seconds=dist.mean / 1e6,
            quantiles=tuple((q, bucket_quantile(q, counts, bounds) / 1e6) for q in QUANTILES),
        )
    return out


def _bucket_bounds(options: Any, n: int) -> list[tuple[float, float]] | None:
    """(lower, upper) of each of `n` buckets: bucket 0 is the underflow, the last one the overflow.

    The layout of google.api.Distribution, which libtpu's `Distribution` copies (tpu_metric_service.proto).
    """
    kind = options.WhichOneof("options")
    if kind == "exponential_buckets":
        e = options.exponential_buckets
        edges = [e.scale * e.growth_factor**i for i in range(n - 1)]
    elif kind == "linear_buckets":
        lin = options.linear_buckets
        edges = [lin.offset + lin.width * i for i in range(n - 1)]
    elif kind == "explicit_buckets":
        edges = list(options.explicit_buckets.bounds)[: n - 1]
    else:
        return None
    if len(edges) != n - 1 or n < 2:
        return None
    lowers = [0.0, *edges]
    uppers = [*edges, math.inf]
    return list(zip(lowers, uppers, strict=True))


def bucket_quantile(q: float, counts: list[int], bounds: list[tuple[float, float]]) -> float:
    """The q-quantile, interpolated linearly inside its bucket (as Prometheus's histogram_quantile and tpu-info do).

    A quantile in the overflow bucket is its lower bound: there is no upper one to interpolate to.
    """
    rank = q * sum(counts)
    below = 0
    for count, (lower, upper) in zip(counts, bounds, strict=True):
        if count > 0 and below + count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / count
        below += count
    return bounds[-1][0]
