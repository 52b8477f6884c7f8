"""The gRPC client: one long-lived channel, every call with a deadline, all calls of a poll in flight at once."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxmon.sources.libtpu.names import CORE, DEVICE_GAUGES, HLO_TIMING, MEGASCALE, MEGASCALE_NAMES, OPTIONAL
from jaxmon.sources.libtpu.parse import Summary, Timing, gauges, summaries, timings


class LibtpuUnavailable(Exception):
    """The service did not answer a core metric: nothing listening, too slow, or an error status."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class LibtpuReading:
    """One poll: per metric, the value of each device-id that libtpu answered for; the host's distributions."""

    gauges: Mapping[str, Mapping[int, float]]
    timings: Mapping[int, Timing] = field(default_factory=dict)
    # Megascale metric -> its distributions (one per buffer size where it has them); only those answered.
    host: Mapping[str, tuple[Summary, ...]] = field(default_factory=dict)
    # Optional metrics this libtpu lists but that failed this poll (name -> status): the poll is partial.
    failed: Mapping[str, str] = field(default_factory=dict)
    # Optional metrics this libtpu does not serve: not listed, or refused as a libtpu refuses a metric it has not
    # got (a megascale one outside a multi-slice job). Their series are absent; the poll is whole.
    unserved: frozenset[str] = frozenset()
    # Metrics answered with entries of which jaxmon could read none (another message shape): absent.
    unreadable: frozenset[str] = frozenset()


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
        unserved = {name for name in OPTIONAL if name not in supported}
        for name, future in futures.items():
            try:
                responses[name] = future.result()
            except self._grpc.RpcError as exc:
                if name not in CORE and self._refused_as_not_served(name, exc.code()):
                    unserved.add(name)
                    continue
                failed[name] = exc.code().name
                if name in CORE:
                    for other in futures.values():
                        other.cancel()
                    self._supported = None
                    raise LibtpuUnavailable(exc.code().name, exc.details() or "") from None
        return self._reading(responses, failed, frozenset(unserved))

    def _reading(self, responses: dict[str, Any], failed: dict[str, str], unserved: frozenset[str]) -> LibtpuReading:
        entries = {name: response.metric.metrics for name, response in responses.items()}
        per_device = {name: gauges(entries[name]) for name in DEVICE_GAUGES if name in entries}
        host = {spec.name: summaries(entries[spec.name], spec) for spec in MEGASCALE if spec.name in entries}
        unreadable = {name for name, values in (*per_device.items(), *host.items()) if entries[name] and not values}
        return LibtpuReading(
            gauges=per_device,
            timings=timings(entries[HLO_TIMING]) if HLO_TIMING in entries else {},
            host={name: values for name, values in host.items() if values},
            failed=failed,
            unserved=unserved,
            unreadable=frozenset(unreadable),
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

    def _refused_as_not_served(self, name: str, code: Any) -> bool:
        """Whether an optional metric's error status means "not served here" rather than a failure.

        A libtpu that cannot list its metrics refuses one it does not serve (NOT_FOUND, UNIMPLEMENTED,
        INVALID_ARGUMENT). A megascale metric answered NOT_FOUND or UNAVAILABLE while the core metrics answered on
        the same channel is libtpu outside a multi-slice job: tpu-info reads both statuses so ("metrics
        unavailable. Did you start a MULTI_SLICE workload", cli_helper.TransferLatencyTables).
        """
        status = self._grpc.StatusCode
        if not self._listed and code in (status.NOT_FOUND, status.UNIMPLEMENTED, status.INVALID_ARGUMENT):
            return True
        return name in MEGASCALE_NAMES and code in (status.NOT_FOUND, status.UNAVAILABLE)

    def _request(self, name: str) -> Any:
        return self._pb.MetricRequest(metric_name=name)

    def _left(self, deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())
