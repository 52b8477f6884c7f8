"""The "Device-wide" row: duty cycle, memory, power, clocks and errors from NVML or libtpu, outside JAX."""

from __future__ import annotations

from ..panels import DEV, DEVICE_LEGEND, INST, MEM, UP_MAPPING, WIDE_LEGEND, Panel, Row, Target, bottom, rate, top

# Per-GPU series summed over their links keep these labels (NVML's series carry source="nvml").
GPU_BY = "instance, platform, device, source"
GPU_LEGEND = "{{instance}} {{platform}}:{{device}}"
MIG_LEGEND = "{{instance}} {{platform}}:{{device}} {{profile}} gi {{gpu_instance}} ({{mig_uuid}})"
PROCESS_LEGEND = "{{instance}} {{platform}}:{{device}} pid {{pid}} {{workload}}"
ON_OFF_MAPPING = {"1": ("on", "blue"), "0": ("off", "text")}
YES_RED_MAPPING = {"1": ("yes", "red"), "0": ("no", "green")}

# Device-wide numbers from a source outside JAX (NVML on GPU, libtpu's runtime metrics on TPU): the shared family
# names with a `source` label, so one row serves both. A sidecar beside a job that holds the chips sees these
# without owning a device.
ROW = Row(
    "Device-wide (NVML on GPU, libtpu on TPU)",
    [
        Panel(
            "Duty cycle (device-wide) vs probe estimate",
            "timeseries",
            "percentunit",
            [
                Target(top(f"jaxmon_device_duty_cycle_ratio{{{DEV}}}"), WIDE_LEGEND + " duty cycle"),
                Target(top(f"jaxmon_device_utilization_ratio{{{DEV}}}"), DEVICE_LEGEND + " probe estimate"),
            ],
            "Share of the last sample period with any kernel running, as the device-wide source reports it (one "
            "tiny kernel running all the time reads 100 %), beside the probe's slowdown estimate of the same "
            "device where both exist.",
            min=0,
            max=1,
        ),
        Panel(
            "Device memory used vs total (all processes)",
            "timeseries",
            "bytes",
            [
                Target(top(f"jaxmon_device_memory_used_bytes{{{DEV}}}"), WIDE_LEGEND + " used"),
                Target(top(f"jaxmon_device_memory_total_bytes{{{DEV}}}"), WIDE_LEGEND + " total"),
            ],
            "Device-wide memory: every process on the device plus what jaxmon's allocator statistics cannot see.",
            min=0,
        ),
        Panel(
            "Device memory used / total (all processes)",
            "timeseries",
            "percentunit",
            [
                Target(
                    top(f"jaxmon_device_memory_used_bytes{{{DEV}}} / jaxmon_device_memory_total_bytes{{{DEV}}}"),
                    WIDE_LEGEND,
                )
            ],
            "Share of device memory in use by all processes; JaxmonDeviceMemoryNearFull fires over 95 %.",
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.95, "red")],
        ),
        Panel(
            "Device memory by process",
            "timeseries",
            "bytes",
            [
                Target(
                    top(f"jaxmon_process_device_memory_bytes{{{MEM}}}"),
                    PROCESS_LEGEND,
                ),
                Target(
                    top(
                        f"jaxmon_process_device_memory_other_bytes{{{DEV}}} > 0 and on (instance, platform, device) "
                        f"jaxmon_process_device_memory_other_processes{{{DEV}}} > 0"
                    ),
                    "{{instance}} {{platform}}:{{device}} other processes",
                ),
            ],
            "Each running compute process's device memory (NVML), the --collector.nvml.max-processes largest per "
            "GPU, and the rest's together; workload where the pid is a reporting workload's (needs a shared PID "
            "namespace).",
            min=0,
        ),
        Panel(
            "Utilization by process (shared GPUs)",
            "timeseries",
            "percentunit",
            [
                Target(top(f"jaxmon_process_sm_utilization_ratio{{{MEM}}}"), PROCESS_LEGEND + " SM"),
                Target(
                    top(f"jaxmon_process_memory_bandwidth_utilization_ratio{{{MEM}}}"),
                    PROCESS_LEGEND + " memory bandwidth",
                ),
            ],
            "Each compute process's share of its GPU's SM time and memory bandwidth (NVML's per-process samples "
            "since the previous poll, averaged): on a time-sliced or MPS GPU, which process uses it. The "
            "--collector.nvml.max-processes busiest per GPU; none on MIG-enabled GPUs.",
            min=0,
            max=1,
        ),
        Panel(
            "Video engines by process",
            "timeseries",
            "percentunit",
            [
                Target(top(f"jaxmon_process_encoder_utilization_ratio{{{MEM}}}"), PROCESS_LEGEND + " encoder"),
                Target(top(f"jaxmon_process_decoder_utilization_ratio{{{MEM}}}"), PROCESS_LEGEND + " decoder"),
            ],
            "Each compute process's share of its GPU's video encoder (NVENC) and decoder (NVDEC) time (NVML's "
            "per-process samples since the previous poll, averaged).",
            min=0,
            max=1,
        ),
        Panel(
            "Device memory used by pod (kubelet)",
            "timeseries",
            "bytes",
            [
                Target(
                    top(f'sum by (instance, namespace, pod) (jaxmon_device_memory_used_bytes{{{DEV}, pod!=""}})'),
                    "{{instance}} {{namespace}}/{{pod}}",
                )
            ],
            "Device-wide memory of the devices each pod holds, from a node-mode jaxmon with the kubernetes "
            "collector; pods that share a time-sliced GPU show as one comma-joined entry, so nothing is counted "
            "twice.",
            min=0,
        ),
        Panel(
            "Devices held by pods (kubelet)",
            "table",
            "none",
            [Target(top(f"jaxmon_kubernetes_pod_device_info{{{INST}}}"), table=True)],
            "Each GPU, MIG device and TPU chip the kubelet assigned to a container (device_id as its device "
            "plugin names it), one row per pod even where pods share a time-sliced GPU.",
        ),
        Panel(
            "GPUs used by Slurm jobs (cgroups)",
            "table",
            "none",
            [Target(top(f"jaxmon_slurm_job_device_info{{{INST}}}"), table=True)],
            "Each GPU a Slurm job's processes use (job_id, the job's uid, device, UUID), from a node-mode jaxmon with "
            "the slurm collector; a GPU two jobs share has a row for each.",
        ),
        Panel(
            "Memory bandwidth utilization",
            "timeseries",
            "percentunit",
            [Target(top(f"jaxmon_device_memory_bandwidth_utilization_ratio{{{DEV}}}"), WIDE_LEGEND)],
            "Share of the last sample period in which device memory was read or written.",
            min=0,
            max=1,
        ),
        Panel(
            "Power vs limit",
            "timeseries",
            "watt",
            [
                Target(top(f"jaxmon_device_power_watts{{{DEV}}}"), WIDE_LEGEND + " power"),
                Target(top(f"jaxmon_device_power_limit_watts{{{DEV}}}"), WIDE_LEGEND + " enforced limit"),
                Target(top(f"jaxmon_device_power_management_limit_watts{{{DEV}}}"), WIDE_LEGEND + " management limit"),
                Target(
                    top(rate("jaxmon_device_energy_joules_total", DEV)), WIDE_LEGEND + " mean power (energy counter)"
                ),
            ],
            "Power draw, the enforced power limit and the power management limit set on the GPU (the enforced one "
            "is the lowest of it and the board's constraints), and the mean power over each interval from the "
            "energy counter (joules per second), which a momentary power reading can miss.",
            min=0,
        ),
        Panel(
            "Temperature",
            "timeseries",
            "celsius",
            [Target(top(f"jaxmon_device_temperature_celsius{{{DEV}}}"), WIDE_LEGEND)],
            "GPU core temperature; JaxmonGpuHot fires over 85 °C.",
            thresholds=[(0, "green"), (85, "red")],
        ),
        Panel(
            "SM and graphics clocks vs their maxima",
            "timeseries",
            "hertz",
            [
                Target(bottom(f"jaxmon_device_sm_clock_hertz{{{DEV}}}"), WIDE_LEGEND + " SM"),
                Target(bottom(f"jaxmon_device_graphics_clock_hertz{{{DEV}}}"), WIDE_LEGEND + " graphics"),
                Target(top(f"jaxmon_device_sm_clock_max_hertz{{{DEV}}}"), WIDE_LEGEND + " SM max"),
                Target(top(f"jaxmon_device_graphics_clock_max_hertz{{{DEV}}}"), WIDE_LEGEND + " graphics max"),
            ],
            "Current SM and graphics clocks beside the highest the GPU runs at; they drop while a throttle reason "
            "is active.",
            min=0,
        ),
        Panel(
            "Memory and video clocks vs their maxima",
            "timeseries",
            "hertz",
            [
                Target(bottom(f"jaxmon_device_memory_clock_hertz{{{DEV}}}"), WIDE_LEGEND + " memory"),
                Target(bottom(f"jaxmon_device_video_clock_hertz{{{DEV}}}"), WIDE_LEGEND + " video"),
                Target(top(f"jaxmon_device_memory_clock_max_hertz{{{DEV}}}"), WIDE_LEGEND + " memory max"),
                Target(top(f"jaxmon_device_video_clock_max_hertz{{{DEV}}}"), WIDE_LEGEND + " video max"),
            ],
            "Current memory and video clocks beside their maxima.",
            min=0,
        ),
        Panel(
            "Fan speed",
            "timeseries",
            "percentunit",
            [Target(top(f"jaxmon_device_fan_speed_ratio{{{DEV}}}"), WIDE_LEGEND + " fan {{fan}}")],
            "Each fan's intended speed as a share of its maximum; boards without fans NVML controls (SXM) have none.",
            min=0,
        ),
        Panel(
            "Video encoder and decoder utilization",
            "timeseries",
            "percentunit",
            [
                Target(top(f"jaxmon_device_encoder_utilization_ratio{{{DEV}}}"), WIDE_LEGEND + " encoder"),
                Target(top(f"jaxmon_device_decoder_utilization_ratio{{{DEV}}}"), WIDE_LEGEND + " decoder"),
            ],
            "Share of the last sample period the video encoder (NVENC) and decoders (NVDEC) were busy, e.g. "
            "decoding a video data set on the GPU.",
            min=0,
            max=1,
        ),
        Panel(
            "PCIe throughput",
            "timeseries",
            "Bps",
            [
                Target(
                    top(f"jaxmon_device_pcie_throughput_bytes_per_second{{{DEV}}}"),
                    WIDE_LEGEND + " {{direction}}",
                )
            ],
            "PCIe traffic by direction (tx: sent by the GPU), as NVML samples it over 20 ms per poll: host-to-device "
            "copies, an input pipeline feeding the GPU.",
            min=0,
        ),
        Panel(
            "PCIe replays",
            "timeseries",
            "short",
            [Target(top(f"increase(jaxmon_device_pcie_replays_total{{{DEV}}}[$__rate_interval])"), WIDE_LEGEND)],
            "PCIe packets resent after link errors, per interval; JaxmonGpuPcieReplays fires while they rise.",
            min=0,
        ),
        Panel(
            "Active NVLink links",
            "timeseries",
            "none",
            [Target(bottom(f"sum by ({GPU_BY}) (jaxmon_device_nvlink_active{{{DEV}}})"), GPU_LEGEND)],
            "NVLink links up on each GPU (18 on H100 and H200 SXM); a drop is a link down.",
            min=0,
        ),
        Panel(
            "NVLink traffic",
            "timeseries",
            "Bps",
            [
                Target(
                    top(f"sum by ({GPU_BY}, direction) ({rate('jaxmon_device_nvlink_data_bytes_total', DEV)})"),
                    GPU_LEGEND + " {{direction}}",
                )
            ],
            "Payload bytes per second over all NVLink links of each GPU, by direction (collectives between GPUs).",
            min=0,
        ),
        Panel(
            "NVLink errors",
            "timeseries",
            "short",
            [
                Target(
                    top(
                        f"sum by ({GPU_BY}, kind) "
                        f"(increase(jaxmon_device_nvlink_errors_total{{{DEV}}}[$__rate_interval]))"
                    ),
                    GPU_LEGEND + " {{kind}}",
                )
            ],
            "NVLink data-link errors per interval over each GPU's links, by kind (replay, recovery, CRC flit, CRC "
            "data); JaxmonGpuNvlinkErrors names the link.",
            min=0,
        ),
        Panel(
            "Active throttle reasons",
            "state-timeline",
            "none",
            [
                Target(
                    top(f'jaxmon_device_throttled{{{DEV}, reason!="gpu_idle"}} == 1'),
                    "{{instance}} {{platform}}:{{device}} {{reason}}",
                )
            ],
            "Clocks event (throttle) reasons NVML reports as active, idle clocks left out.",
        ),
        Panel(
            "TensorCore idle duration (TPU)",
            "timeseries",
            "s",
            [Target(top(f"jaxmon_device_tensorcore_idle_duration_seconds{{{DEV}}}"), WIDE_LEGEND)],
            "The TensorCore idle duration libtpu reports for each TPU device (tpu-info's TensorCore Idle Duration).",
            min=0,
        ),
        Panel(
            "HLO queue size (TPU)",
            "timeseries",
            "none",
            [Target(top(f"jaxmon_device_hlo_queue_size{{{DEV}}}"), WIDE_LEGEND)],
            "Programs queued for execution on each TPU device (libtpu). Near 0 on an idle chip means the host "
            "does not feed it.",
            min=0,
        ),
        Panel(
            "HLO execution time (TPU)",
            "timeseries",
            "s",
            [
                Target(
                    top(f"jaxmon_device_hlo_execution_seconds{{{DEV}}}"),
                    WIDE_LEGEND + " p{{percentile}}",
                ),
                Target(top(f"jaxmon_device_hlo_execution_mean_seconds{{{DEV}}}"), WIDE_LEGEND + " mean"),
            ],
            "Percentiles and mean of HLO program execution time on each TPU device, from libtpu's distribution.",
            min=0,
        ),
        Panel(
            "Device-wide source up",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_device_source_up{{{DEV}}}"), WIDE_LEGEND)],
            "Whether the device-wide source answered for the device in its last poll (0: e.g. GPU lost).",
            mappings=UP_MAPPING,
        ),
        Panel(
            "ECC errors (volatile)",
            "timeseries",
            "none",
            [Target(top(f"jaxmon_device_ecc_errors_total{{{DEV}}}"), WIDE_LEGEND + " {{kind}}")],
            "ECC errors counted since the driver loaded, by kind; absent where ECC is off.",
            min=0,
        ),
        Panel(
            "Remapped rows",
            "timeseries",
            "none",
            [Target(top(f"jaxmon_device_remapped_rows_total{{{DEV}}}"), WIDE_LEGEND + " {{kind}}")],
            "Memory rows replaced by spare rows, by the kind of error that caused it (kept by the GPU across driver "
            "loads).",
            min=0,
        ),
        Panel(
            "Row remapping pending or failed",
            "state-timeline",
            "none",
            [
                Target(top(f"jaxmon_device_row_remapping_pending{{{DEV}}}"), WIDE_LEGEND + " pending (reset needed)"),
                Target(top(f"jaxmon_device_row_remapping_failed{{{DEV}}}"), WIDE_LEGEND + " failed (replace the GPU)"),
            ],
            "A remapping that waits for a GPU reset, and a remapping that failed for want of a spare row.",
            mappings=YES_RED_MAPPING,
        ),
        Panel(
            "Xid errors",
            "timeseries",
            "none",
            [Target(top(f"jaxmon_device_xid_errors_total{{{DEV}}}"), WIDE_LEGEND + " xid {{xid}}")],
            "Critical Xid events counted since jaxmon started, by xid (79: fallen off the bus, 48: DBE).",
            min=0,
        ),
        Panel(
            "MIG mode",
            "state-timeline",
            "none",
            [Target(top(f"jaxmon_device_mig_enabled{{{DEV}}}"), WIDE_LEGEND)],
            "Whether each GPU runs in MIG mode (absent on GPUs without MIG).",
            mappings=ON_OFF_MAPPING,
        ),
        Panel(
            "MIG devices",
            "table",
            "none",
            [Target(top(f"jaxmon_mig_device_info{{{DEV}}}"), MIG_LEGEND, table=True)],
            "Each MIG device with its GPU, UUID (what pods and CUDA_VISIBLE_DEVICES name), GPU and compute "
            "instance and profile.",
        ),
        Panel(
            "MIG device memory used vs total",
            "timeseries",
            "bytes",
            [
                Target(top(f"jaxmon_mig_device_memory_used_bytes{{{DEV}}}"), MIG_LEGEND + " used"),
                Target(top(f"jaxmon_mig_device_memory_total_bytes{{{DEV}}}"), MIG_LEGEND + " total"),
            ],
            "Device memory of each MIG device: in use by its processes, and its size.",
            min=0,
        ),
        Panel(
            "MIG device duty cycle",
            "timeseries",
            "percentunit",
            [Target(top(f"jaxmon_mig_device_duty_cycle_ratio{{{DEV}}}"), MIG_LEGEND)],
            "Share of the last sample period each MIG device ran a kernel, where the driver reports it for MIG "
            "devices.",
            min=0,
            max=1,
        ),
    ],
)
