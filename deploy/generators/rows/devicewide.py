"""The "Device-wide" row: duty cycle, memory, power, clocks and errors from NVML or libtpu, outside JAX."""

from __future__ import annotations

from ..panels import DEV, DEVICE_LEGEND, INST, MEM, UP_MAPPING, WIDE_LEGEND, Panel, Row, Target

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
                Target(f"jaxmon_device_duty_cycle_ratio{{{DEV}}}", WIDE_LEGEND + " duty cycle"),
                Target(f"jaxmon_device_utilization_ratio{{{DEV}}}", DEVICE_LEGEND + " probe estimate"),
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
                Target(f"jaxmon_device_memory_used_bytes{{{DEV}}}", WIDE_LEGEND + " used"),
                Target(f"jaxmon_device_memory_total_bytes{{{DEV}}}", WIDE_LEGEND + " total"),
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
                    f"jaxmon_device_memory_used_bytes{{{DEV}}} / jaxmon_device_memory_total_bytes{{{DEV}}}",
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
                    f"jaxmon_process_device_memory_bytes{{{MEM}}}",
                    "{{instance}} {{platform}}:{{device}} pid {{pid}} {{workload}}",
                )
            ],
            "Each running compute process's device memory (NVML); workload where the pid is a reporting "
            "workload's (needs a shared PID namespace).",
            min=0,
        ),
        Panel(
            "Device memory used by pod (kubelet)",
            "timeseries",
            "bytes",
            [
                Target(
                    f'sum by (instance, namespace, pod) (jaxmon_device_memory_used_bytes{{{DEV}, pod!=""}})',
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
            [Target(f"jaxmon_kubernetes_pod_devices{{{INST}}}", table=True)],
            "Each GPU, MIG device and TPU chip the kubelet assigned to a container (device_id as its device "
            "plugin names it), one row per pod even where pods share a time-sliced GPU.",
        ),
        Panel(
            "Memory bandwidth utilization",
            "timeseries",
            "percentunit",
            [Target(f"jaxmon_device_memory_bandwidth_utilization_ratio{{{DEV}}}", WIDE_LEGEND)],
            "Share of the last sample period in which device memory was read or written.",
            min=0,
            max=1,
        ),
        Panel(
            "Power vs limit",
            "timeseries",
            "watt",
            [
                Target(f"jaxmon_device_power_watts{{{DEV}}}", WIDE_LEGEND + " power"),
                Target(f"jaxmon_device_power_limit_watts{{{DEV}}}", WIDE_LEGEND + " limit"),
            ],
            "Power draw and the enforced power limit.",
            min=0,
        ),
        Panel(
            "Temperature",
            "timeseries",
            "celsius",
            [Target(f"jaxmon_device_temperature_celsius{{{DEV}}}", WIDE_LEGEND)],
            "GPU core temperature; JaxmonGpuHot fires over 85 °C.",
            thresholds=[(0, "green"), (85, "red")],
        ),
        Panel(
            "SM clock",
            "timeseries",
            "hertz",
            [Target(f"jaxmon_device_sm_clock_hertz{{{DEV}}}", WIDE_LEGEND)],
            "Current SM clock; it drops while a throttle reason is active.",
            min=0,
        ),
        Panel(
            "Active throttle reasons",
            "state-timeline",
            "none",
            [
                Target(
                    f'jaxmon_device_throttled{{{DEV}, reason!="gpu_idle"}} == 1',
                    "{{instance}} {{platform}}:{{device}} {{reason}}",
                )
            ],
            "Clocks event (throttle) reasons NVML reports as active, idle clocks left out.",
        ),
        Panel(
            "TensorCore idle duration (TPU)",
            "timeseries",
            "s",
            [Target(f"jaxmon_device_tensorcore_idle_duration_seconds{{{DEV}}}", WIDE_LEGEND)],
            "The TensorCore idle duration libtpu reports for each TPU device (tpu-info's TensorCore Idle Duration).",
            min=0,
        ),
        Panel(
            "HLO queue size (TPU)",
            "timeseries",
            "none",
            [Target(f"jaxmon_device_hlo_queue_size{{{DEV}}}", WIDE_LEGEND)],
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
                    f"jaxmon_device_hlo_execution_seconds{{{DEV}}}",
                    WIDE_LEGEND + " p{{percentile}}",
                ),
                Target(f"jaxmon_device_hlo_execution_mean_seconds{{{DEV}}}", WIDE_LEGEND + " mean"),
            ],
            "Percentiles and mean of HLO program execution time on each TPU device, from libtpu's distribution.",
            min=0,
        ),
        Panel(
            "Device-wide source up",
            "state-timeline",
            "none",
            [Target(f"jaxmon_device_source_up{{{DEV}}}", WIDE_LEGEND)],
            "Whether the device-wide source answered for the device in its last poll (0: e.g. GPU lost).",
            mappings=UP_MAPPING,
        ),
        Panel(
            "ECC errors (volatile)",
            "timeseries",
            "none",
            [Target(f"jaxmon_device_ecc_errors_total{{{DEV}}}", WIDE_LEGEND + " {{kind}}")],
            "ECC errors counted since the driver loaded, by kind; absent where ECC is off.",
            min=0,
        ),
        Panel(
            "Xid errors",
            "timeseries",
            "none",
            [Target(f"jaxmon_device_xid_errors_total{{{DEV}}}", WIDE_LEGEND + " xid {{xid}}")],
            "Critical Xid events counted since jaxmon started, by xid (79: fallen off the bus, 48: DBE).",
            min=0,
        ),
    ],
)
