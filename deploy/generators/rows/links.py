"""The "Where the bytes travel" row (docs/placement.md), on the Job dashboard (one workload) and the main one (the
selected workloads): which link carries each mesh axis, how fast its bytes move against the link's nominal
bandwidth, how much of the step waits on it, and the placement advice (JaxmonTrainingAxisOnSlowLink). The sampled
series are read over an hour: samples are sparse (every 1000 steps by default), as the alert reads them."""

from __future__ import annotations

from ..panels import WL, Panel, Row, Target

JOB = 'workload="$workload"'
AXIS = "{{workload}} {{axes}} on {{link}}"
BY = "workload, axes, link"


def row(selector: str) -> Row:
    """The row for the series `selector` picks (a workload, or the dashboard's instances and workloads)."""
    placed = f'{selector}, axes!=""'
    per_step = (
        f"topk($k, avg by ({BY}) (sum by (instance, process_index, device, {BY}) "
        f"(rate(jaxmon_training_collective_bytes_total{{{placed}}}[$__rate_interval])) "
        f"/ on (instance, process_index) group_left () "
        f"sum by (instance, process_index) (rate(jaxmon_training_steps_total{{{selector}}}[$__rate_interval]))))"
    )
    achieved = (
        f"topk($k, sum by ({BY}) (rate(jaxmon_training_profile_collective_bytes_total{{{placed}}}[1h])) "
        f"/ sum by ({BY}) (rate(jaxmon_training_profile_collective_seconds_total{{{placed}}}[1h])))"
    )
    nominal = f"topk($k, min by (workload, link) (jaxmon_link_nominal_bandwidth_bytes_per_second{{{selector}}}))"
    exposed = (
        f"topk($k, sum by ({BY}) (rate(jaxmon_training_profile_exposed_collective_seconds_total{{{placed}}}[1h])) "
        f"/ on (workload) group_left () "
        f"sum by (workload) (rate(jaxmon_training_profiled_seconds_total{{{selector}}}[1h])))"
    )
    # Sampled device-to-device copy bytes per second of sampled step time, times the step's duration: per step.
    d2d = (
        f"topk($k, sum by (workload) (rate(jaxmon_training_profile_copy_bytes_total{{{selector}, "
        f'direction="device_to_device"}}[1h])) '
        f"/ sum by (workload) (rate(jaxmon_training_profiled_seconds_total{{{selector}}}[1h])) "
        f"* on (workload) (sum by (workload) (rate(jaxmon_training_step_duration_seconds_sum{{{selector}}}[1h])) "
        f"/ sum by (workload) (rate(jaxmon_training_step_duration_seconds_count{{{selector}}}[1h]))))"
    )
    copy_share = (
        f"topk($k, sum by (workload, direction) (rate(jaxmon_training_profile_copy_seconds_total{{{selector}}}[1h])) "
        f"/ on (workload) group_left () "
        f"sum by (workload) (rate(jaxmon_training_profiled_seconds_total{{{selector}}}[1h])))"
    )
    workload = selector.split("workload", 1)[1]
    advice = (
        f'topk($k, ALERTS{{alertname="JaxmonTrainingAxisOnSlowLink", workload{workload}}} '
        f"or on ({BY}) jaxmon:training_axis_swap:best{{workload{workload}}} "
        f"or on ({BY}) (jaxmon:training_axis_bytes_per_step:rate1h{{workload{workload}}} * 0))"
    )
    return Row(
        "Where the bytes travel",
        [
            Panel(
                "Bytes per step by axis and link",
                "timeseries",
                "bytes",
                [Target(per_step, AXIS)],
                "Bytes each device's collectives move per step over each mesh axis, by the slowest link the axis's "
                "groups cross (from the compiled programs: every call of a tracked function). The heaviest axis "
                "belongs on the fastest link.",
                min=0,
            ),
            Panel(
                "Achieved against nominal bandwidth",
                "timeseries",
                "Bps",
                [Target(achieved, "achieved " + AXIS), Target(nominal, "{{workload}} nominal {{link}}")],
                "Bus bandwidth each axis's collectives reached in the sampled steps (their bytes over their time, "
                "nccl-tests' convention), against each link's nominal bandwidth per direction (vendor figures: none "
                "for a device kind jaxmon's table does not know, e.g. CPU devices). Far below nominal: small "
                "messages (latency-bound) or a congested link.",
                min=0,
            ),
            Panel(
                "Exposed share by axis and link",
                "timeseries",
                "percentunit",
                [Target(exposed, AXIS)],
                "The share of the sampled steps' time spent waiting on each axis's collectives (no compute "
                "running). At or over 10 % on a slower link than a lighter axis's fires JaxmonTrainingAxisOnSlowLink.",
                min=0,
                thresholds=[(0, "green"), (0.1, "orange")],
            ),
            Panel(
                "Device-to-device copy bytes per step",
                "timeseries",
                "bytes",
                [Target(d2d, "{{workload}}")],
                "Bytes copied from one device to another per step and device in the sampled steps "
                '(jaxmon_training_profile_copy_bytes_total{direction="device_to_device"}: a GPU\'s MemcpyD2D and '
                "MemcpyP2P). An operation on arrays of two devices copies one of them silently: a placement bug "
                "shows here first. Traces that say no copy sizes (CPU devices, TPUs) have none.",
                min=0,
            ),
            Panel(
                "Copy share by direction",
                "timeseries",
                "percentunit",
                [Target(copy_share, "{{workload}} {{direction}}")],
                "The share of the sampled steps' time spent only copying, by direction (host_to_device, "
                "device_to_host, device_to_device; other where the trace does not say): the copy part of the "
                "sampled split. A device_to_device share that grows after a change of mesh or sharding is a "
                "placement bug's copy.",
                min=0,
            ),
            Panel(
                "Placement advice",
                "table",
                "none",
                [Target(advice, table=True)],
                "JaxmonTrainingAxisOnSlowLink's state for each axis (pending or firing, with the axis and its "
                "link); for each other axis, the swap the alert would name (an axis on a slower link than a "
                "lighter axis: swap_axes on swap_link) with the seconds per step it saves at nominal bandwidth "
                "(jaxmon:training_axis_swap:best; -1 where a link's nominal bandwidth is not known), or 0: nothing "
                "to swap. docs/placement.md says how.",
            ),
        ],
    )


ROW = row(JOB)  # the Job dashboard's
MAIN = row(WL)  # the main dashboard's, beside the training row
