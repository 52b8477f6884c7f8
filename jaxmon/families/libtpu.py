"""The tpu collector's renderers of its own families: per host the megascale distributions, and the SDK's.

A megascale distribution is rendered as a Prometheus summary: libtpu's distributions are cumulative, so its count
and its sum (count x mean) are counters Prometheus can take a rate of (a recent mean, for the dashboard and the
alert), and its quantiles are tpu-info's percentiles (p50, p90, p95, p999) since libtpu started.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.catalog import metrics
from jaxmon.catalog.metrics import Family
from jaxmon.families import add
from jaxmon.sources.libtpu import Summary, names, sdk
from jaxmon.sources.libtpu.sdk_state import SdkState

# libtpu's megascale metric -> its summary family
MEGASCALE = {
    names.DCN_TRANSFER: metrics.MEGASCALE_DCN_TRANSFER_LATENCY_SECONDS,
    names.DCN_INBOUND_TRANSFER: metrics.MEGASCALE_DCN_INBOUND_TRANSFER_LATENCY_SECONDS,
    names.HOST_TO_DEVICE_TRANSFER: metrics.MEGASCALE_HOST_TO_DEVICE_TRANSFER_LATENCY_SECONDS,
    names.DEVICE_TO_HOST_TRANSFER: metrics.MEGASCALE_DEVICE_TO_HOST_TRANSFER_LATENCY_SECONDS,
    names.COLLECTIVE_END_TO_END: metrics.MEGASCALE_COLLECTIVE_END_TO_END_LATENCY_SECONDS,
    names.HOST_COMPUTE: metrics.MEGASCALE_HOST_COMPUTE_LATENCY_SECONDS,
    names.GRPC_TCP_MIN_RTT: metrics.MEGASCALE_GRPC_TCP_MIN_RTT_SECONDS,
    names.GRPC_TCP_DELIVERY_RATE: metrics.MEGASCALE_GRPC_TCP_DELIVERY_RATE_BYTES_PER_SECOND,
}


def summary_family(spec: Family, rows: Iterable[tuple[dict[str, str], Summary]]) -> Metric:
    """A summary family of (labels, distribution) rows: `_count`, `_sum`, and the quantiles where there are any."""
    fam = spec.new()
    for labels, s in rows:
        if s.buffer_size is not None:
            labels = {**labels, "buffer_size": s.buffer_size}
        for q, value in s.quantiles:
            fam.samples.append(Sample(spec.name, {**labels, "quantile": f"{q:g}"}, value))
        fam.samples.append(Sample(spec.name + "_count", labels, float(s.count)))
        fam.samples.append(Sample(spec.name + "_sum", labels, s.total))
    return fam


def sdk_families(st: SdkState | None) -> Iterator[Metric]:
    """The SDK's status set (one series per status, 1 on the current one), the child's starts and failed starts, and
    each TensorCore's utilization; nothing where the SDK is not read."""
    if st is None:
        return
    status = metrics.LIBTPU_SDK_STATUS.new()
    for name in sdk.STATUSES:
        add(status, {"source": "libtpu", "status": name}, 1.0 if name == st.status else 0.0)
    starts = metrics.LIBTPU_SDK_CHILD_STARTS.new()
    add(starts, {"source": "libtpu"}, st.starts)
    failures = metrics.LIBTPU_SDK_CHILD_SPAWN_FAILURES.new()
    add(failures, {"source": "libtpu"}, st.spawn_failures)
    util = metrics.DEVICE_TENSORCORE_UTILIZATION_RATIO.new()
    for core in st.cores:
        add(util, {"device": core.device, "platform": "tpu", "source": "libtpu", "core": str(core.core)}, core.ratio)
    yield from (status, starts, failures, util)
