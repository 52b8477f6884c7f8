"""The tpu collector's own families (the device-wide ones it shares with NVML are in `shared`): per chip the
tensorcore idle duration, the HLO queue and the HLO execution time; per host the megascale distributions.

A megascale distribution is rendered as a Prometheus summary: libtpu's distributions are cumulative, so its count
and its sum (count x mean) are counters Prometheus can take a rate of (a recent mean, for the dashboard and the
alert), and its quantiles are tpu-info's percentiles (p50, p90, p95, p999) since libtpu started.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.families import Spec, add
from jaxmon.sources.libtpu import Summary, names, sdk
from jaxmon.sources.libtpu.sdk_state import SdkState

IDLE_DURATION = Spec(
    "jaxmon_device_tensorcore_idle_duration_seconds",
    "TensorCore idle duration of the device as libtpu reports it (tpu.runtime.tensorcore.idle_duration.seconds; "
    "tpu-info's TensorCore Idle Duration).",
)
HLO_QUEUE = Spec("jaxmon_device_hlo_queue_size", "HLO programs queued for execution on the device (libtpu).")
HLO_EXECUTION = Spec(
    "jaxmon_device_hlo_execution_seconds",
    "HLO program execution time on the device at a percentile (label percentile: 50, 90, 95, 99.9), "
    "from libtpu's distribution.",
)
HLO_EXECUTION_MEAN = Spec("jaxmon_device_hlo_execution_mean_seconds", "Mean HLO program execution time (libtpu).")

# From libtpu's monitoring SDK, read in a child process of the daemon (jaxmon/collectors/tpu_sdk.py).
TENSORCORE_UTILIZATION = Spec(
    "jaxmon_device_tensorcore_utilization_ratio",
    "Utilization of one TensorCore of the chip (label core: its index in libtpu's list), from libtpu's monitoring "
    "SDK (tensorcore_util; tpu-info's TensorCore Utilization), 0-1: the TPU ladder's rung between the duty cycle "
    "and MFU.",
)
SDK_STATUS = Spec(
    "jaxmon_libtpu_sdk_status",
    "1 on the current status of the daemon's reading of libtpu's monitoring SDK (its child process), 0 on the "
    "others: ok, empty (the SDK answered no values), starting (libtpu is being imported), not_installed, "
    "import_failed, failed (the SDK raised), crashed (the child died), timeout (no answer within "
    "--collector.tpu.sdk-timeout), spawn_failed (the child could not be started: fork's EAGAIN at a pids limit, "
    "no temporary directory).",
)
SDK_STARTS = Spec(
    "jaxmon_libtpu_sdk_child_starts",
    "Child processes started to read libtpu's monitoring SDK (one, unless children crashed or hung).",
    counter=True,
)
SDK_SPAWN_FAILURES = Spec(
    "jaxmon_libtpu_sdk_child_spawn_failures",
    "Starts of the SDK's child process that failed (fork's EAGAIN at a pids limit, no temporary directory), each "
    "tried again after a back-off; the tpu collector's gRPC series are not affected.",
    counter=True,
)

_CUMULATIVE = (
    " From libtpu's cumulative distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu started "
    "(tpu-info's p50 to p999); rate(_sum) / rate(_count) is the recent mean."
)
_BY_SIZE = " By buffer size (label buffer_size), the host's entries of each size summed as tpu-info sums them."

# libtpu's megascale metric -> its summary family (name and HELP)
MEGASCALE = {
    names.DCN_TRANSFER: Spec(
        "jaxmon_megascale_dcn_transfer_latency_seconds",
        "Latency of buffer transfers over the data-center network (DCN) between the slices of a multi-slice job "
        "(tpu-info's Buffer Transfer Latency)." + _BY_SIZE + _CUMULATIVE,
    ),
    names.DCN_INBOUND_TRANSFER: Spec(
        "jaxmon_megascale_dcn_inbound_transfer_latency_seconds",
        "Latency of inbound buffer transfers over DCN from other slices (tpu-info's Inbound Buffer Transfer "
        "Latency)." + _BY_SIZE + _CUMULATIVE,
    ),
    names.HOST_TO_DEVICE_TRANSFER: Spec(
        "jaxmon_megascale_host_to_device_transfer_latency_seconds",
        "Latency of the host-to-device transfers of multi-slice traffic (tpu-info's Host to Device Transfer "
        "Latency)." + _BY_SIZE + _CUMULATIVE,
    ),
    names.DEVICE_TO_HOST_TRANSFER: Spec(
        "jaxmon_megascale_device_to_host_transfer_latency_seconds",
        "Latency of the device-to-host transfers of multi-slice traffic (tpu-info's Device to Host Transfer "
        "Latency)." + _BY_SIZE + _CUMULATIVE,
    ),
    names.COLLECTIVE_END_TO_END: Spec(
        "jaxmon_megascale_collective_end_to_end_latency_seconds",
        "End-to-end latency of collectives across slices (tpu-info's Collective End to End Latency)."
        + _BY_SIZE
        + _CUMULATIVE,
    ),
    names.HOST_COMPUTE: Spec(
        "jaxmon_megascale_host_compute_latency_seconds",
        "Latency of the host's compute in multi-slice collectives (libtpu's mxla_compute_latencies; tpu-info's "
        "Host Compute Latency)." + _BY_SIZE + _CUMULATIVE,
    ),
    names.GRPC_TCP_MIN_RTT: Spec(
        "jaxmon_megascale_grpc_tcp_min_rtt_seconds",
        "Minimum TCP round-trip time of the host's multi-slice gRPC connections, all connections summed into one "
        "distribution (tpu-info's gRPC TCP Minimum RTT)." + _CUMULATIVE,
    ),
    names.GRPC_TCP_DELIVERY_RATE: Spec(
        "jaxmon_megascale_grpc_tcp_delivery_rate_bytes_per_second",
        "TCP delivery rate of the host's multi-slice gRPC connections in bytes per second (libtpu's Mbps x 125000), "
        "all connections summed into one distribution (tpu-info's gRPC TCP Delivery Rate)." + _CUMULATIVE,
    ),
}


def summary_family(spec: Spec, rows: Iterable[tuple[dict[str, str], Summary]]) -> Metric:
    """A summary family of (labels, distribution) rows: `_count`, `_sum`, and the quantiles where there are any."""
    fam = Metric(spec.name, spec.help, "summary")
    for labels, s in rows:
        if s.buffer_size is not None:
            labels = {**labels, "buffer_size": s.buffer_size}
        for q, value in s.quantiles:
            fam.samples.append(Sample(spec.name, {**labels, "quantile": f"{q:g}"}, value))
        fam.samples.append(Sample(spec.name + "_count", labels, float(s.count)))
        fam.samples.append(Sample(spec.name + "_sum", labels, s.total))
    return fam


def sdk_families(st: SdkState | None) -> Iterator[Metric]:
    """The SDK's status set (one series per status, 1 on the current one), the child's starts, and each
    TensorCore's utilization; nothing where the SDK is not read."""
    if st is None:
        return
    status = SDK_STATUS.new()
    for name in sdk.STATUSES:
        add(status, {"source": "libtpu", "status": name}, 1.0 if name == st.status else 0.0)
    starts = SDK_STARTS.new()
    add(starts, {"source": "libtpu"}, st.starts)
    failures = SDK_SPAWN_FAILURES.new()
    add(failures, {"source": "libtpu"}, st.spawn_failures)
    util = TENSORCORE_UTILIZATION.new()
    for core in st.cores:
        add(util, {"device": core.device, "platform": "tpu", "source": "libtpu", "core": str(core.core)}, core.ratio)
    yield from (status, starts, failures, util)


# The labels and sources of these families, for docs/metrics.md (jaxmon.families.labels' table).
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
    "jaxmon_libtpu_sdk_child_spawn_failures": ("source", "the daemon's SDK child processes that could not start"),
}
