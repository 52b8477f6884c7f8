"""The labels and sources of libtpu's runtime metrics families (jaxmon/families/libtpu.py), part of
jaxmon.families.labels' table."""

from __future__ import annotations

LIBTPU_LABELS_AND_SOURCE: dict[str, tuple[str, str]] = {
    "jaxmon_device_hlo_queue_size": (
        "device, platform, source (+ pod, namespace, container)",
        "libtpu `hlo.queue.size.gauge`",
    ),
    "jaxmon_device_hlo_execution_seconds": (
        "device, platform, source, percentile (+ pod, namespace, container)",
        "libtpu `hlo.execution.timing.distribution.microseconds` / 10⁶",
    ),
    "jaxmon_device_hlo_execution_mean_seconds": (
        "device, platform, source (+ pod, namespace, container)",
        "same distribution's mean / 10⁶",
    ),
    "jaxmon_device_tensorcore_idle_duration_seconds": (
        "device, platform, source (+ pod, namespace, container)",
        "libtpu `tpu.runtime.tensorcore.idle_duration.seconds`",
    ),
    "jaxmon_megascale_dcn_transfer_latency_seconds": (
        "source, buffer_size (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.dcn_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_dcn_inbound_transfer_latency_seconds": (
        "source, buffer_size (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_host_to_device_transfer_latency_seconds": (
        "source, buffer_size (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_device_to_host_transfer_latency_seconds": (
        "source, buffer_size (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_collective_end_to_end_latency_seconds": (
        "source, buffer_size (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_host_compute_latency_seconds": (
        "source, buffer_size (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.mxla_compute_latencies.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_grpc_tcp_min_rtt_seconds": (
        "source (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution` / 10⁶",
    ),
    "jaxmon_megascale_grpc_tcp_delivery_rate_bytes_per_second": (
        "source (+ quantile; + pod, namespace, container)",
        "libtpu `megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution` × 125 000 (Mbps to bytes/s)",
    ),
    "jaxmon_device_tensorcore_utilization_ratio": (
        "device, platform, source, core (+ pod, namespace, container)",
        'libtpu SDK `tpumonitoring.get_metric("tensorcore_util").data()` / 100, read in the daemon\'s child process',
    ),
    "jaxmon_libtpu_sdk_status": ("source, status", "the daemon's SDK child: its import, its answers, its deadline"),
    "jaxmon_libtpu_sdk_child_starts": ("source", "the daemon's SDK child processes started"),
}
