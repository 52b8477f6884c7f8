"""The libtpu runtime metrics jaxmon reads: libtpu's names (tpu-info's `MetricName` values, checked against it when
a client starts) and how each is read.

Per device-id: HBM total and usage, tensorcore duty cycle (the core three, served by every libtpu that has the
service), HBM bandwidth utilization, tensorcore idle duration, HLO queue size and the HLO execution time
distribution. Per host: the megascale (multi-slice, over DCN) distributions, which libtpu serves on a multi-slice
job; tpu-info reads them with `get_transfer_latency` (tpu_info/metrics.py) and shows their percentiles.
"""

from __future__ import annotations

from dataclasses import dataclass

TOTAL = "tpu.runtime.hbm.memory.total.bytes"
USAGE = "tpu.runtime.hbm.memory.usage.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_UTILIZATION = "tpu.runtime.hbm.utilization.percent"
IDLE_DURATION = "tpu.runtime.tensorcore.idle_duration.seconds"
HLO_QUEUE = "hlo.queue.size.gauge"
HLO_TIMING = "hlo.execution.timing.distribution.microseconds"

DCN_TRANSFER = "megascale.dcn_transfer_latencies.microsecond.cumulative.distribution"
DCN_INBOUND_TRANSFER = "megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution"
HOST_TO_DEVICE_TRANSFER = "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution"
DEVICE_TO_HOST_TRANSFER = "megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution"
COLLECTIVE_END_TO_END = "megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution"
HOST_COMPUTE = "megascale.mxla_compute_latencies.microsecond.cumulative.distribution"
GRPC_TCP_MIN_RTT = "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution"
GRPC_TCP_DELIVERY_RATE = "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution"

MICROSECONDS = 1e-6  # -> seconds
MEGABITS_PER_SECOND = 1e6 / 8  # -> bytes per second


@dataclass(frozen=True)
class HostDistribution:
    """A megascale distribution: `to_base` turns its unit into jaxmon's (seconds, bytes per second).

    tpu-info groups a response's entries by buffer size and sums each group's buckets before taking percentiles
    (`get_transfer_latency`); the gRPC TCP ones have no buffer size, so each is one distribution over all the
    host's connections.
    """

    name: str
    to_base: float
    by_buffer_size: bool


MEGASCALE = (
    HostDistribution(DCN_TRANSFER, MICROSECONDS, by_buffer_size=True),
    HostDistribution(DCN_INBOUND_TRANSFER, MICROSECONDS, by_buffer_size=True),
    HostDistribution(HOST_TO_DEVICE_TRANSFER, MICROSECONDS, by_buffer_size=True),
    HostDistribution(DEVICE_TO_HOST_TRANSFER, MICROSECONDS, by_buffer_size=True),
    HostDistribution(COLLECTIVE_END_TO_END, MICROSECONDS, by_buffer_size=True),
    HostDistribution(HOST_COMPUTE, MICROSECONDS, by_buffer_size=True),
    HostDistribution(GRPC_TCP_MIN_RTT, MICROSECONDS, by_buffer_size=False),
    HostDistribution(GRPC_TCP_DELIVERY_RATE, MEGABITS_PER_SECOND, by_buffer_size=False),
)
MEGASCALE_NAMES = frozenset(m.name for m in MEGASCALE)

# Served by every libtpu that has the service: a poll without them has failed. The others only where served.
CORE = (TOTAL, USAGE, DUTY_CYCLE)
OPTIONAL = (HBM_UTILIZATION, IDLE_DURATION, HLO_QUEUE, HLO_TIMING, *(m.name for m in MEGASCALE))
# Gauges per device-id (the rest are distributions).
DEVICE_GAUGES = (TOTAL, USAGE, DUTY_CYCLE, HBM_UTILIZATION, IDLE_DURATION, HLO_QUEUE)
# The percentiles tpu-info shows (p50, p90, p95, p999), as quantiles.
QUANTILES = (0.5, 0.9, 0.95, 0.999)
