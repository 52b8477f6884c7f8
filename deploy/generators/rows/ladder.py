"""The "Utilization ladder" row: per GPU, duty cycle >= SM active >= tensor active (clock-adjusted) >= MFU, beside
the probe's estimate, and the rest of NVML's GPM activity. Each per-GPU panel shows the $k GPUs whose duty cycle
most overstates their SM activity (the "busy but idle" ones first), so it reads the same at 8 GPUs as at 8,000.

The two recorded rungs come from deploy/prometheus/job.yml (jaxmon:device_tensor_active_ratio:clock_adjusted,
jaxmon:device_model_flops_utilization_ratio); the rest are NVML's series as scraped.
"""

from __future__ import annotations

from ..panels import DEV, Panel, Row, Target

LEGEND = "{{instance}} gpu:{{device}}"
MIG_LEGEND = LEGEND + "{{gpu_instance}}"


def rung(title: str, targets: list[Target], description: str) -> Panel:
    return Panel(title, "timeseries", "percentunit", targets, description, min=0, max=1)


def row(DEV: str = DEV) -> Row:
    """The row over the devices `DEV` selects (the main dashboard's variables unless told)."""
    GPU = DEV + ', source="nvml"'
    # A whole GPU's GPM series (a MIG GPU instance's carry gpu_instance).
    WHOLE = GPU + ', gpu_instance=""'
    # The $k GPUs whose duty cycle most exceeds their SM activity.
    SELECTED = (
        f"topk($k, max by (job, instance, device) (jaxmon_device_duty_cycle_ratio{{{GPU}}}) "
        f"- max by (job, instance, device) (jaxmon_device_sm_active_ratio{{{WHOLE}}}))"
    )
    # The probe's estimate of a JAX GPU that jaxmon matched to its NVML GPU (its device label is then the same); a GPU
    # labelled by NVML index is not the probe's device of that number.
    PROBE = (
        f"(jaxmon_device_utilization_ratio{{{DEV}}} and on (job, instance, platform, device) "
        f"jaxmon_device_info{{{GPU}}}) "
        f'unless on (job, instance, device) jaxmon_device_info{{{GPU}, device_match="nvml_index"}}'
    )
    TENSOR = f"jaxmon:device_tensor_active_ratio:clock_adjusted{{{GPU}}}"
    MFU = f"jaxmon:device_model_flops_utilization_ratio{{{DEV}}}"

    def selected(expr: str) -> str:
        """`expr` for the selected GPUs only."""
        return f"{expr} and on (job, instance, device) {SELECTED}"

    return Row(
        "Utilization ladder (NVML GPM)",
        [
            Panel(
                "The ladder, mean over the GPUs",
                "bargauge",
                "percentunit",
                [
                    Target(f"avg(jaxmon_device_duty_cycle_ratio{{{GPU}}})", "duty cycle"),
                    Target(f"avg(jaxmon_device_sm_active_ratio{{{WHOLE}}})", "SM active"),
                    Target(f"avg({TENSOR})", "tensor active (clock-adjusted)"),
                    Target(f"avg({MFU})", "MFU"),
                    Target(f"avg({PROBE})", "probe estimate"),
                ],
                "Each rung bounds the next: a kernel ran (duty cycle) >= the SMs had work (SM active) >= the tensor "
                "cores worked, scaled by the SM clock over its maximum >= the model's FLOPs over the peak (MFU, where "
                "a training reports one). The gap between two rungs is where the FLOPs go. The probe's estimate is "
                "shown where jaxmon matched the GPU to a JAX device. Needs GPM (Hopper and newer) for the middle "
                "rungs, and deploy/prometheus/job.yml for the recorded ones.",
                min=0,
                max=1,
            ),
            Panel(
                "GPUs with GPM",
                "stat",
                "none",
                [
                    Target(f"sum(jaxmon_device_gpm_supported{{{GPU}}})", "with GPM"),
                    Target(f"sum(1 - jaxmon_device_gpm_supported{{{GPU}}})", "without"),
                ],
                "GPUs (and MIG GPU instances) whose NVML serves GPM metrics; one without has no SM, tensor, DRAM or "
                "pipe series (pre-Hopper, an old driver, or --collector.nvml.gpm=false), and jaxmon logged why.",
            ),
            rung(
                "Duty cycle (the $k GPUs busiest beyond their SM activity)",
                [Target(selected(f"jaxmon_device_duty_cycle_ratio{{{GPU}}}"), LEGEND)],
                "NVML's utilization: the share of time any kernel ran. One small kernel running all the time reads "
                "100 %. JaxmonGpuBusyButIdle fires (info) for a GPU at 80 % or more whose SMs are active under 20 % of "
                "the time for 30 minutes.",
            ),
            rung(
                "SM active",
                [Target(selected(f"jaxmon_device_sm_active_ratio{{{GPU}}}"), MIG_LEGEND)],
                "The share of time the SMs had at least one warp resident (GPM SM_UTIL; DCGM's SM_ACTIVE, "
                "SM_UTIL_RATIO from dcgm-exporter 4.9), per GPU and MIG GPU instance. DCGM's guide: 0.8 or more is "
                "needed (not enough) for a GPU used well.",
            ),
            rung(
                "Tensor active (clock-adjusted)",
                [
                    Target(selected(TENSOR), MIG_LEGEND + " clock-adjusted"),
                    Target(selected(f"jaxmon_device_tensor_active_ratio{{{GPU}}}"), MIG_LEGEND + " raw"),
                ],
                "Tensor-core activity (GPM ANY_TENSOR_UTIL; DCGM's PIPE_TENSOR_ACTIVE, TENSOR_UTIL_RATIO from "
                "dcgm-exporter 4.9) and the same scaled by the SM clock over its maximum: an upper bound for what the "
                "FLOPs reach, not MFU.",
            ),
            rung(
                "MFU beside the GPU",
                [Target(selected(MFU), LEGEND + " {{workload}} ({{join}})")],
                "The training's MFU on the GPU: the JAX device's own where jaxmon matched its GPUs to JAX devices "
                "(join=device), else the mean over the devices of the processes in the pod that holds the GPU, or "
                "reporting to its jaxmon (join=process).",
            ),
            rung(
                "Probe estimate",
                [Target(selected(PROBE), LEGEND)],
                "The probe's slowdown estimate of the GPU, where jaxmon matched the GPU to the JAX device it probes.",
            ),
            rung(
                "SM occupancy, DRAM and graphics engine activity",
                [
                    Target(selected(f"jaxmon_device_sm_occupancy_ratio{{{GPU}}}"), MIG_LEGEND + " SM occupancy"),
                    Target(selected(f"jaxmon_device_dram_active_ratio{{{GPU}}}"), MIG_LEGEND + " DRAM"),
                    Target(
                        selected(f"jaxmon_device_graphics_engine_active_ratio{{{GPU}}}"),
                        MIG_LEGEND + " graphics engine",
                    ),
                ],
                "Resident warps over the SMs' maximum (DCGM's SM_OCCUPANCY, SM_OCCUPANCY_RATIO from dcgm-exporter "
                "4.9), the share of time device memory was read or written (DRAM_ACTIVE or DRAM_UTIL_RATIO: a "
                "memory-bound step is high here and low on tensor), and the graphics or compute engine's activity "
                "(GR_ENGINE_ACTIVE or GR_ENGINE_UTIL_RATIO).",
            ),
            rung(
                "Pipe activity",
                [Target(selected(f"jaxmon_device_pipe_active_ratio{{{GPU}}}"), MIG_LEGEND + " {{pipe}}")],
                "Activity of each pipe (fp64, fp32, fp16, tensor_hmma, tensor_imma, tensor_dfma, integer): which "
                "arithmetic the GPU spends its time on (7 series a GPU: exported with --collector.nvml.gpm-pipes).",
            ),
        ],
    )


ROW = row()
