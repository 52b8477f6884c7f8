"""The "TPU utilization ladder" row: per chip, duty cycle >= TensorCore utilization >= MFU, the TPU's counterpart of
the GPU ladder (ladder.py). Each per-chip panel shows the $k chips whose duty cycle most overstates their TensorCore
utilization (busy but idle first), so it reads the same at 4 chips as at 4,000.

The duty cycle is libtpu's gRPC runtime metric; the TensorCore rung comes from libtpu's monitoring SDK, which the
daemon (sidecar or node) reads in a child process (`--collector.tpu.sdk`); the two recorded rungs come from
deploy/prometheus/job.yml (jaxmon:device_tensorcore_utilization_ratio:chip, jaxmon:device_model_flops_utilization_ratio
with platform="tpu").
"""

from __future__ import annotations

from ..panels import DEV, Panel, Row, Target

LEGEND = "{{instance}} tpu:{{device}}"


def rung(title: str, targets: list[Target], description: str) -> Panel:
    return Panel(title, "timeseries", "percentunit", targets, description, min=0, max=1)


def row(DEV: str = DEV) -> Row:
    """The row over the devices `DEV` selects (the main dashboard's variables unless told)."""
    TPU = DEV + ', source="libtpu"'
    DUTY = f"jaxmon_device_duty_cycle_ratio{{{TPU}}}"
    CORE = f"jaxmon:device_tensorcore_utilization_ratio:chip{{{TPU}}}"
    MFU = f'jaxmon:device_model_flops_utilization_ratio{{{DEV}, platform="tpu"}}'
    SELECTED = f"topk($k, max by (job, instance, device) ({DUTY}) - max by (job, instance, device) ({CORE}))"

    def selected(expr: str) -> str:
        """`expr` for the selected chips only."""
        return f"{expr} and on (job, instance, device) {SELECTED}"

    return Row(
        "TPU utilization ladder (libtpu)",
        [
            Panel(
                "The ladder, mean over the TPU chips",
                "bargauge",
                "percentunit",
                [
                    Target(f"avg({DUTY})", "duty cycle"),
                    Target(f"avg({CORE})", "TensorCore utilization"),
                    Target(f"avg({MFU})", "MFU"),
                ],
                "Each rung bounds the next: the TensorCore ran a program (duty cycle) >= its units were busy "
                "(TensorCore utilization, libtpu's monitoring SDK) >= the model's FLOPs over the chip's peak (MFU, "
                "where a training reports one). The gap between two rungs is where the FLOPs go. Needs the daemon "
                "beside the job (sidecar or node mode) for the SDK rung, and deploy/prometheus/job.yml for the "
                "recorded ones.",
                min=0,
                max=1,
            ),
            Panel(
                "libtpu monitoring SDK status",
                "stat",
                "none",
                [
                    Target(
                        f'sum by (status) (jaxmon_libtpu_sdk_status{{{inst_of(DEV)}, source="libtpu"}} == 1)',
                        "{{status}}",
                    ),
                    Target(
                        f'sum(jaxmon_libtpu_sdk_child_starts_total{{{inst_of(DEV)}, source="libtpu"}})',
                        "child starts",
                    ),
                    Target(
                        f'sum(jaxmon_libtpu_sdk_child_spawn_failures_total{{{inst_of(DEV)}, source="libtpu"}})',
                        "child starts failed",
                    ),
                ],
                "How many daemons read the SDK with each status: ok; empty (the SDK answered no values, as on a "
                "sandboxed chip); starting; not_installed (no libtpu in the daemon's image); import_failed, "
                "failed, crashed or timeout (the child process failed: its series are absent and it is started "
                "again after a back-off; the daemon's log says why); spawn_failed (no child could be started: a "
                "pids limit, no temporary directory; the gRPC series still flow). Child starts, all daemons "
                "together since each started: more than one a daemon means children crashed or hung; failed "
                "starts are counted apart.",
            ),
            rung(
                "Duty cycle (the $k chips busiest beyond their TensorCore utilization)",
                [Target(selected(DUTY), LEGEND)],
                "libtpu's TensorCore duty cycle: the share of time a program ran on the chip. A small program "
                "running all the time reads 100 %.",
            ),
            rung(
                "TensorCore utilization",
                [
                    Target(selected(CORE), LEGEND),
                    Target(selected(f"jaxmon_device_tensorcore_utilization_ratio{{{TPU}}}"), LEGEND + " core {{core}}"),
                ],
                "libtpu's tensorcore_util (monitoring SDK) of each TensorCore, and the chip's mean over them: how "
                "busy the TensorCore's units were. No gRPC metric serves it; the daemon reads it in a child "
                "process.",
            ),
            rung(
                "MFU beside the chip",
                [Target(selected(MFU), LEGEND + " {{workload}} ({{join}})")],
                "The training's MFU on the chip: the mean over the devices of the one TPU workload reporting to "
                "the same jaxmon (join=process).",
            ),
        ],
    )


def inst_of(dev: str) -> str:
    """The job and instance selectors of a device selector (the status series name no device)."""
    return ", ".join(part for part in dev.split(", ") if part.startswith(("job=", "instance=")))


ROW = row()
