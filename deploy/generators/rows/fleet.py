"""The "GPU and TPU fleet" dashboard's rows, for the SRE: health, memory, duty cycle and the utilization ladder, and
which pod holds which device. Counts and aggregates over the fleet, and the `$k` worst devices, so that the
dashboard reads the same at 8 devices as at 32,000. `namespace` and `pod` select the devices a pod holds (a node-mode
jaxmon with the kubernetes collector labels them); "All" also keeps the devices no pod holds."""

from __future__ import annotations

from ..panels import DEV, INST, OK_MAPPING, Panel, Row, Target, bottom, exporters_up, top
from . import ladder, tpu_ladder

POD = 'namespace=~"$namespace", pod=~"$pod"'
FLEET = DEV + ", " + POD
WIDE = "{{instance}} {{platform}}:{{device}} {{namespace}}/{{pod}}"
GPU = "{{instance}} gpu:{{device}} {{namespace}}/{{pod}}"


def count(expr: str) -> str:
    """How many series `expr` returns (0, not nothing, when none)."""
    return f"count({expr}) or vector(0)"


def stat(title: str, expr: str, description: str, bad: float = 1) -> Panel:
    return Panel(
        title,
        "stat",
        "short",
        [Target(expr, title)],
        description,
        width=3,
        height=4,
        thresholds=[(0, "green"), (bad, "red")],
    )


HEALTH = Row(
    "Health",
    [
        exporters_up(width=3),
        stat(
            "Exporters down",
            count(
                f"up{{{INST}}} == 0 unless on (job, instance) (jaxmon:exporter_stopped "
                f"or last_over_time(jaxmon_exporter_stopping{{{INST}}}[10m]) == 1)"
            ),
            "jaxmon targets whose scrape fails (JaxmonExporterDown), less embedded exporters whose job finished (their "
            "last scrape said jaxmon_exporter_stopping 1).",
        ),
        stat(
            "Devices lost",
            count(f"jaxmon_device_source_up{{{FLEET}}} == 0"),
            "Devices the device-wide source (NVML, libtpu) could not read in its last poll (JaxmonGpuLost).",
        ),
        stat(
            "GPUs with an Xid",
            count(f"increase(jaxmon_device_xid_errors_total{{{FLEET}}}[$__range]) > 0"),
            "GPUs with a critical Xid event in the time range (JaxmonGpuXidError).",
        ),
        stat(
            "GPUs with uncorrected ECC errors",
            count(f'jaxmon_device_ecc_errors_total{{{FLEET}, kind="uncorrected"}} > 0'),
            "GPUs with uncorrected ECC errors since the driver loaded (JaxmonGpuEccUncorrected).",
        ),
        stat(
            "Row remapping pending or failed",
            count(
                f"jaxmon_device_row_remapping_pending{{{FLEET}}} == 1 "
                f"or jaxmon_device_row_remapping_failed{{{FLEET}}} == 1"
            ),
            "GPUs waiting for a reset to remap a row, or out of spare rows (JaxmonGpuRowRemapFailed).",
        ),
        stat(
            "GPUs throttled",
            count(f'max by (job, instance, device) (jaxmon_device_throttled{{{FLEET}, reason!="gpu_idle"}}) == 1'),
            "GPUs with an active clocks event reason other than idle (JaxmonGpuThrottled, JaxmonGpuPowerCapped).",
        ),
        stat(
            "GPUs over 85 °C",
            count(f"jaxmon_device_temperature_celsius{{{FLEET}}} > 85"),
            "GPUs hotter than JaxmonGpuHot's threshold.",
        ),
        Panel(
            "Exporters and devices down",
            "table",
            "none",
            [
                Target(bottom(f"up{{{INST}}}") + " == 0", table=True),
                Target(bottom(f"jaxmon_device_source_up{{{FLEET}}}") + " == 0", table=True),
            ],
            "The jaxmon targets whose scrape fails and the devices their source could not read ($k of each at most).",
            mappings=OK_MAPPING,
            height=7,
        ),
        Panel(
            "Throttle reasons",
            "timeseries",
            "none",
            [
                Target(
                    f'count by (reason) (jaxmon_device_throttled{{{FLEET}, reason!="gpu_idle"}} == 1)',
                    "{{reason}}",
                )
            ],
            "How many GPUs each active clocks event (throttle) reason slows, idle clocks left out.",
            min=0,
            height=7,
        ),
        Panel(
            "Xid errors, ECC and remapped rows",
            "timeseries",
            "short",
            [
                Target(
                    top(f"increase(jaxmon_device_xid_errors_total{{{FLEET}}}[$__rate_interval])"), GPU + " xid {{xid}}"
                ),
                Target(top(f"jaxmon_device_ecc_errors_total{{{FLEET}}}"), GPU + " ECC {{kind}}"),
                Target(top(f"jaxmon_device_remapped_rows_total{{{FLEET}}}"), GPU + " rows remapped ({{kind}})"),
            ],
            "The $k GPUs with the most Xid events per interval, ECC errors since the driver loaded, and rows "
            "remapped (kept across driver loads).",
            min=0,
        ),
        Panel(
            "Temperature: the hottest devices",
            "timeseries",
            "celsius",
            [
                Target(f"max(jaxmon_device_temperature_celsius{{{FLEET}}})", "hottest"),
                Target(f"avg(jaxmon_device_temperature_celsius{{{FLEET}}})", "mean"),
                Target(top(f"jaxmon_device_temperature_celsius{{{FLEET}}}"), WIDE),
            ],
            "The fleet's hottest and mean core temperature, and the $k hottest devices; JaxmonGpuHot fires over 85 °C.",
            thresholds=[(0, "green"), (85, "red")],
        ),
        Panel(
            "Power: the fleet, and the devices nearest their limit",
            "timeseries",
            "watt",
            [
                Target(f"sum(jaxmon_device_power_watts{{{FLEET}}})", "fleet total"),
                Target(
                    f"jaxmon_device_power_watts{{{FLEET}}} and on (job, instance, device) "
                    + top(f"jaxmon_device_power_watts{{{FLEET}}} / jaxmon_device_power_limit_watts{{{FLEET}}}"),
                    WIDE,
                ),
            ],
            "The fleet's power draw, and the power of the $k devices drawing the largest share of their enforced "
            "limit (a device at its cap runs slower: JaxmonGpuPowerCapped).",
            min=0,
        ),
    ],
)

MEMORY = Row(
    "Memory",
    [
        Panel(
            "Device memory: the fleet",
            "timeseries",
            "bytes",
            [
                Target(f"sum(jaxmon_device_memory_used_bytes{{{FLEET}}})", "used"),
                Target(f"sum(jaxmon_device_memory_total_bytes{{{FLEET}}})", "total"),
            ],
            "Device-wide memory (every process on the devices) of the selected devices, together.",
            min=0,
            width=8,
        ),
        Panel(
            "Device memory used / total: the fullest devices",
            "timeseries",
            "percentunit",
            [
                Target(
                    top(f"jaxmon_device_memory_used_bytes{{{FLEET}}} / jaxmon_device_memory_total_bytes{{{FLEET}}}"),
                    WIDE,
                ),
            ],
            "The $k devices with the largest share of their memory in use by all processes; "
            "JaxmonDeviceMemoryNearFull fires over 95 %.",
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.95, "red")],
            width=8,
        ),
        Panel(
            "Least OOM headroom (JAX allocator)",
            "timeseries",
            "bytes",
            [
                Target(
                    bottom(f"jaxmon_memory_largest_allocatable_bytes{{{DEV}}}"),
                    "{{instance}} {{platform}}:{{device}} {{workload}}",
                )
            ],
            "The $k devices whose JAX allocator can serve the smallest next allocation (the allocator's own "
            "statistics, in the process that holds the device).",
            min=0,
            width=8,
        ),
    ],
)

UTILIZATION = Row(
    "Duty cycle",
    [
        Panel(
            "Duty cycle: the fleet and the least busy devices",
            "timeseries",
            "percentunit",
            [
                Target(f"avg(jaxmon_device_duty_cycle_ratio{{{FLEET}}})", "mean"),
                Target(bottom(f"jaxmon_device_duty_cycle_ratio{{{FLEET}}}"), WIDE),
            ],
            "Share of the last sample period with any kernel running (NVML, libtpu): the fleet's mean, and the $k "
            "least busy devices (idle accelerators, JaxmonTpuIdle). A high duty cycle says little: see the ladder "
            "below.",
            min=0,
            max=1,
        ),
        Panel(
            "Devices by duty cycle",
            "bargauge",
            "none",
            [
                Target(count(f"jaxmon_device_duty_cycle_ratio{{{FLEET}}} < 0.1"), "under 10 %"),
                Target(
                    count(f"jaxmon_device_duty_cycle_ratio{{{FLEET}}} >= 0.1 < 0.8"),
                    "10 to 80 %",
                ),
                Target(count(f"jaxmon_device_duty_cycle_ratio{{{FLEET}}} >= 0.8"), "80 % and more"),
            ],
            "How many of the selected devices are idle, partly busy and busy.",
            min=0,
        ),
    ],
)

PODS = Row(
    "Pod attribution (kubelet)",
    [
        Panel(
            "Pods holding devices",
            "stat",
            "none",
            [
                Target(
                    count(f"count by (namespace, pod) (jaxmon_kubernetes_pod_device_info{{{INST}, {POD}}})"),
                    "pods",
                ),
                Target(count(f"jaxmon_kubernetes_pod_device_info{{{INST}, {POD}}}"), "devices"),
            ],
            "Pods the kubelet assigned accelerators to, and the devices they hold (a node-mode jaxmon with the "
            "kubernetes collector).",
            width=4,
        ),
        Panel(
            "Device memory by pod: the largest",
            "timeseries",
            "bytes",
            [
                Target(
                    top(f'sum by (namespace, pod) (jaxmon_device_memory_used_bytes{{{FLEET}, pod!=""}})'),
                    "{{namespace}}/{{pod}}",
                )
            ],
            "The $k pods whose devices hold the most memory; pods sharing a time-sliced GPU show as one "
            "comma-joined entry.",
            min=0,
            width=10,
        ),
        Panel(
            "Duty cycle by pod: the least busy",
            "timeseries",
            "percentunit",
            [
                Target(
                    bottom(f'avg by (namespace, pod) (jaxmon_device_duty_cycle_ratio{{{FLEET}, pod!=""}})'),
                    "{{namespace}}/{{pod}}",
                )
            ],
            "The $k pods whose devices are least busy (mean duty cycle over each pod's devices): accelerators "
            "held and not used.",
            min=0,
            max=1,
            width=10,
        ),
        Panel(
            "SM use by pod on shared GPUs: the busiest",
            "timeseries",
            "percentunit",
            [
                Target(
                    top(f'sum by (namespace, pod) (jaxmon_process_sm_utilization_ratio{{{FLEET}, pod!=""}})'),
                    "{{namespace}}/{{pod}}",
                )
            ],
            "The $k pods whose processes use the most GPU SM time, summed over their processes and GPUs (NVML's "
            "per-process samples; 1 = one GPU's SMs all the time): on a time-sliced GPU, which of the pods "
            "holding it uses it. None from MIG-enabled GPUs.",
            min=0,
            width=10,
        ),
        Panel(
            "Devices held by pods",
            "table",
            "none",
            [Target(top(f"jaxmon_kubernetes_pod_device_info{{{INST}, {POD}}}"), table=True)],
            "Each GPU, MIG device and TPU chip the kubelet assigned to a container (device_id as its device plugin "
            "names it): $k rows at most; choose a namespace or a pod to list theirs.",
            width=24,
        ),
    ],
)


# A Slurm job's GPUs: jaxmon_slurm_job_device_info joined to the device series on (instance, device), the info on the
# left so that a GPU two jobs share (gres/shard, MPS) joins both, not a many-to-many error.
def job_gpus(metric: str) -> str:
    """`metric` of each GPU a Slurm job uses, with the job's labels."""
    return (
        f'jaxmon_slurm_job_device_info{{{INST}}} * on (instance, device) group_left () {metric}{{{DEV}, source="nvml"}}'
    )


SLURM = Row(
    "Slurm jobs",
    [
        Panel(
            "Slurm jobs using GPUs",
            "stat",
            "none",
            [
                Target(count(f"count by (job_id) (jaxmon_slurm_job_device_info{{{INST}}})"), "jobs"),
                Target(count(f"jaxmon_slurm_job_device_info{{{INST}}}"), "job GPUs"),
            ],
            "Slurm jobs whose processes use a GPU, and those GPUs (a node-mode jaxmon on a Slurm node, with the "
            "slurm collector).",
            width=4,
        ),
        Panel(
            "Duty cycle by Slurm job: the least busy",
            "timeseries",
            "percentunit",
            [Target(bottom(f"avg by (job_id) ({job_gpus('jaxmon_device_duty_cycle_ratio')})"), "job {{job_id}}")],
            "The $k Slurm jobs whose GPUs are least busy (mean duty cycle over each job's GPUs): GPUs allocated and "
            "not used.",
            min=0,
            max=1,
            width=10,
        ),
        Panel(
            "GPUs used by Slurm jobs",
            "table",
            "none",
            [Target(top(f"jaxmon_slurm_job_device_info{{{INST}}}"), table=True)],
            "Each GPU a Slurm job's processes use (job_id, the job's uid, device and UUID): $k rows at most.",
            width=10,
        ),
    ],
)

ROWS = [HEALTH, MEMORY, UTILIZATION, ladder.row(FLEET), tpu_ladder.row(FLEET), PODS, SLURM]
