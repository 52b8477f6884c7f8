"""libtpu's runtime metrics service, read the way tpu-info reads it: no access to the chips, only gRPC on loopback.

The training process's libtpu serves `tpu.monitoring.runtime.RuntimeMetricService` (default `localhost:8431`).
jaxmon uses tpu-info's generated stubs and metric names (`tpu_info.proto`, `tpu_info.metrics.MetricName`), but not
its client functions: those open a new channel per call and set no deadline (tpu_info/metrics.py,
`get_chip_usage_new`), and a poll here must be bounded. So: one long-lived channel with tpu-info's credentials
(`grpc.local_channel_credentials()`), every call with a deadline, all calls of a poll in flight at once
(`client.py`). `names.py` lists the metrics and how each is read, `parse.py` turns libtpu's messages into numbers
the way tpu-info's parsers do.

grpc and tpu_info are imported when a client is made, never at jaxmon import time (`jaxmon --help` stays fast).
"""

from __future__ import annotations

from jaxmon.sources.libtpu.client import LibtpuClient, LibtpuReading, LibtpuUnavailable
from jaxmon.sources.libtpu.names import (
    CORE,
    DUTY_CYCLE,
    HBM_UTILIZATION,
    HLO_QUEUE,
    HLO_TIMING,
    IDLE_DURATION,
    MEGASCALE,
    OPTIONAL,
    QUANTILES,
    TOTAL,
    USAGE,
    HostDistribution,
)
from jaxmon.sources.libtpu.parse import NO_BUFFER_SIZE, Summary, Timing, bucket_quantile, device_id

__all__ = [
    "CORE",
    "DUTY_CYCLE",
    "HBM_UTILIZATION",
    "HLO_QUEUE",
    "HLO_TIMING",
    "IDLE_DURATION",
    "MEGASCALE",
    "NO_BUFFER_SIZE",
    "OPTIONAL",
    "QUANTILES",
    "TOTAL",
    "USAGE",
    "HostDistribution",
    "LibtpuClient",
    "LibtpuReading",
    "LibtpuUnavailable",
    "Summary",
    "Timing",
    "bucket_quantile",
    "device_id",
]
