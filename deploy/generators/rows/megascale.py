"""The "TPU multi-slice" row: libtpu's megascale distributions of each host (DCN transfers, collectives, host-device
transfers, host compute, gRPC TCP), as tpu-info shows them, with their recent means."""

from __future__ import annotations

from ..panels import INST, Panel, Row, Target, rate, top

SIZED_LEGEND = "{{instance}} {{buffer_size}}"


def _recent_mean(family: str) -> str:
    """The mean over Grafana's rate interval, from the summary's `_sum` and `_count` counters."""
    return f"{rate(family + '_sum', INST)} / {rate(family + '_count', INST)}"


def _distribution(family: str, legend: str, what: str = "") -> list[Target]:
    """The cumulative distribution's quantiles (since libtpu started) and the recent mean of one summary."""
    return [
        Target(top(f"{family}{{{INST}}}"), f"{legend} {what}q{{{{quantile}}}} (since start)"),
        Target(top(_recent_mean(family)), f"{legend} {what}mean (recent)"),
    ]


_SINCE_START = (
    " The quantiles are libtpu's over its whole run (a cumulative distribution), so they move slowly late in a job; "
    "the recent mean (rate of the sum over rate of the count) shows a change at once."
)

ROW = Row(
    "TPU multi-slice (megascale, libtpu)",
    [
        Panel(
            "DCN transfer latency (multi-slice)",
            "timeseries",
            "s",
            _distribution("jaxmon_megascale_dcn_transfer_latency_seconds", SIZED_LEGEND),
            "Latency of buffer transfers over the data-center network between slices, by buffer size (tpu-info's "
            "Buffer Transfer Latency); JaxmonTpuDcnTransferLatencyHigh fires when the recent mean doubles."
            + _SINCE_START,
            min=0,
        ),
        Panel(
            "DCN inbound transfer latency (multi-slice)",
            "timeseries",
            "s",
            _distribution("jaxmon_megascale_dcn_inbound_transfer_latency_seconds", SIZED_LEGEND),
            "Latency of inbound buffer transfers from the other slices, by buffer size." + _SINCE_START,
            min=0,
        ),
        Panel(
            "DCN transfers per second (multi-slice)",
            "timeseries",
            "ops",
            [
                Target(top(rate("jaxmon_megascale_dcn_transfer_latency_seconds_count", INST)), SIZED_LEGEND + " out"),
                Target(
                    top(rate("jaxmon_megascale_dcn_inbound_transfer_latency_seconds_count", INST)), SIZED_LEGEND + " in"
                ),
            ],
            "Buffer transfers over DCN per second, by buffer size: the traffic the latencies are measured on.",
            min=0,
        ),
        Panel(
            "Collective end-to-end latency (multi-slice)",
            "timeseries",
            "s",
            _distribution("jaxmon_megascale_collective_end_to_end_latency_seconds", SIZED_LEGEND),
            "End-to-end latency of the collectives across slices, by buffer size." + _SINCE_START,
            min=0,
        ),
        Panel(
            "Host-to-device and device-to-host transfer latency (multi-slice)",
            "timeseries",
            "s",
            _distribution("jaxmon_megascale_host_to_device_transfer_latency_seconds", SIZED_LEGEND, "to device ")
            + _distribution("jaxmon_megascale_device_to_host_transfer_latency_seconds", SIZED_LEGEND, "to host "),
            "The host-device legs of multi-slice transfers, by buffer size." + _SINCE_START,
            min=0,
        ),
        Panel(
            "Host compute latency (multi-slice)",
            "timeseries",
            "s",
            _distribution("jaxmon_megascale_host_compute_latency_seconds", SIZED_LEGEND),
            "Latency of the host's compute in multi-slice collectives (libtpu's mxla_compute_latencies), by buffer "
            "size." + _SINCE_START,
            min=0,
        ),
        Panel(
            "gRPC TCP minimum RTT (multi-slice)",
            "timeseries",
            "s",
            _distribution("jaxmon_megascale_grpc_tcp_min_rtt_seconds", "{{instance}}"),
            "Minimum TCP round-trip time of each host's multi-slice gRPC connections, all connections in one "
            "distribution: a rise is the network path, not the slices." + _SINCE_START,
            min=0,
        ),
        Panel(
            "gRPC TCP delivery rate (multi-slice)",
            "timeseries",
            "Bps",
            _distribution("jaxmon_megascale_grpc_tcp_delivery_rate_bytes_per_second", "{{instance}}"),
            "TCP delivery rate of each host's multi-slice gRPC connections (libtpu's Mbps in bytes per second), all "
            "connections in one distribution." + _SINCE_START,
            min=0,
        ),
    ],
)
