"""The Job dashboard's rows: one training job (a `workload`) across its processes and devices, from the recording
rules of deploy/prometheus/job.yml. Every per-process or per-device panel shows the `$k` worst (topk / bottomk), so
that the dashboard reads the same at 4 processes as at 4,096."""

from __future__ import annotations

from ..panels import Panel, Row, Target
from . import links

JOB = 'workload="$workload"'
PROCESS = "process {{process_index}} ({{host}})"
DEVICE = "{{instance}} {{platform}}:{{device}}"
BUCKETS = f"rate(jaxmon_training_step_duration_seconds_bucket{{{JOB}}}[$__rate_interval])"
MFU = f"jaxmon_training_model_flops_utilization_ratio{{{JOB}}}"
# job.yml's records (docs/job-rules.md).
GOODPUT = f"jaxmon:training_goodput_ratio:rate5m{{{JOB}}}"
JOB_ALERTS = 'alertname=~"JaxmonTraining.*|JaxmonDeviceMemorySkew"'
SCORE_THRESHOLDS = [(0, "red"), (0.5, "orange"), (0.85, "green")]

SUMMARY = Row(
    "Job",
    [
        Panel(
            "Processes",
            "stat",
            "none",
            [Target(f"count(jaxmon_training_last_step_timestamp_seconds{{{JOB}}})", "processes")],
            "Processes of the workload that export training series (compare with their process_count).",
            width=4,
            height=4,
        ),
        Panel(
            "Median step time",
            "stat",
            "s",
            [Target(f"jaxmon:training_step_seconds:job_median5m{{{JOB}}}", "median")],
            "The job's median process's mean step time over 5 minutes.",
            width=4,
            height=4,
        ),
        Panel(
            "Median host wait",
            "stat",
            "percentunit",
            [Target(f"jaxmon:training_host_wait_ratio:job_median5m{{{JOB}}}", "median")],
            "The share of time the job's median process's devices waited for its host.",
            width=4,
            height=4,
        ),
        Panel(
            "Lowest host score",
            "stat",
            "percentunit",
            [Target(f"min(jaxmon:training_host_score{{{JOB}}})", "lowest")],
            "The straggler's host score (1: as busy as the median process; under 0.5 for 10 minutes fires "
            "JaxmonTrainingStraggler).",
            width=4,
            height=4,
            min=0,
            max=1,
            thresholds=SCORE_THRESHOLDS,
        ),
        Panel(
            "Slowest device",
            "stat",
            "percentunit",
            [Target(f"min(jaxmon:device_speed:relative{{{JOB}}})", "slowest")],
            "The slowest device's speed over the median of the job's devices of its kind (probe FLOP/s on an idle "
            "device, NVML's SM clock on a busy GPU).",
            width=4,
            height=4,
            min=0,
            thresholds=SCORE_THRESHOLDS,
        ),
        Panel(
            "Job alerts firing",
            "stat",
            "none",
            [Target(f'count(ALERTS{{{JOB_ALERTS}, alertstate="firing", {JOB}}}) or vector(0)', "firing")],
            "Training and job-view alerts firing for this workload (Prometheus's ALERTS series).",
            width=4,
            height=4,
            thresholds=[(0, "green"), (1, "red")],
        ),
    ],
)

PROCESSES = Row(
    "Processes: the stragglers",
    [
        Panel(
            "Lowest host scores",
            "bargauge",
            "percentunit",
            [Target(f"bottomk($k, jaxmon:training_host_score{{{JOB}}})", PROCESS)],
            "The $k processes whose host keeps their devices busy least, against the job's median process "
            "(1 - own host wait) / (1 - median). In a synchronous job every process's step takes the slowest's "
            "time, so the straggler shows here, not in step time.",
            min=0,
            max=1,
            thresholds=SCORE_THRESHOLDS,
        ),
        Panel(
            "Least collective wait (compute stragglers)",
            "bargauge",
            "percentunit",
            [Target(f"topk($k, jaxmon:training_collective_wait_gap:mean1h{{{JOB}}})", PROCESS)],
            "How much less of the step the $k least-waiting processes' devices waited in collectives than the job's "
            "median process's, over the last hour's sampled traces: the devices that compute slowly wait least "
            "while the others wait for them. Over 0.1 (and 5 x the job's spread) for 15 minutes fires "
            "JaxmonTrainingComputeStraggler, unless the process's host wait explains it.",
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.05, "orange"), (0.1, "red")],
        ),
        Panel(
            "Host wait: the most waiting processes and the median",
            "timeseries",
            "percentunit",
            [
                Target(f"topk($k, jaxmon:training_host_wait_ratio:rate5m{{{JOB}}})", PROCESS),
                Target(f"jaxmon:training_host_wait_ratio:job_median5m{{{JOB}}}", "job median"),
            ],
            "The share of time each process's devices waited for its host, for the $k most waiting processes at "
            "each moment, beside the job's median.",
            min=0,
        ),
        Panel(
            "Step time distribution (all processes)",
            "heatmap",
            "s",
            [Target(f"sum by (le) ({BUCKETS})", "{{le}}")],
            "Every step of every process of the job, by duration (the step histogram's buckets, summed over the "
            "job). A second band above the main one is a share of slow steps.",
        ),
        Panel(
            "Step time: the slowest processes and the median",
            "timeseries",
            "s",
            [
                Target(f"topk($k, jaxmon:training_step_seconds:mean5m{{{JOB}}})", PROCESS),
                Target(f"jaxmon:training_step_seconds:job_median5m{{{JOB}}}", "job median"),
            ],
            "Mean step time over 5 minutes of the $k slowest processes, beside the job's median (equal in a "
            "synchronous job; apart in an asynchronous one).",
            min=0,
        ),
        Panel(
            "Furthest behind in dispatch",
            "table",
            "none",
            [Target(f"bottomk($k, jaxmon_training_dispatched_step{{{JOB}}})", table=True)],
            "The $k processes with the lowest last dispatched step: in a synchronous job the one behind the "
            "others is the one they wait for (JaxmonTrainingProcessStalled).",
            height=7,
        ),
        Panel(
            "Longest since the last step",
            "table",
            "s",
            [Target(f"topk($k, time() - jaxmon_training_last_step_timestamp_seconds{{{JOB}}})", table=True)],
            "The $k processes whose last completed step is oldest.",
            height=7,
        ),
    ],
)


# What the job is for: its throughput, MFU and goodput (as on the JAX training dashboard).
THROUGHPUT = Row(
    "Throughput, MFU and goodput",
    [
        Panel(
            "Tokens and examples per second (the job)",
            "timeseries",
            "short",
            [
                Target(f"jaxmon:training_tokens_per_second:rate1m{{{JOB}}}", "tokens/s"),
                Target(f"jaxmon:training_examples_per_second:rate1m{{{JOB}}}", "examples/s"),
            ],
            "Every process passes the job's figures to jaxmon.step() and exports its share (÷ process count), so "
            "the sum over the job's processes is the job's.",
            min=0,
            width=8,
        ),
        Panel(
            "MFU: the job's mean and its lowest devices",
            "timeseries",
            "percentunit",
            [
                Target(f"avg({MFU})", "mean"),
                Target(f"bottomk($k, {MFU})", "process {{process_index}} {{platform}}:{{device}}"),
            ],
            "Model FLOPs utilization over the last window of steps: the mean over the job's devices, and the $k "
            "devices with the lowest (needs jaxmon.step(model_flops=) and a known peak).",
            min=0,
            max=1,
            width=8,
        ),
        Panel(
            "Goodput",
            "timeseries",
            "percentunit",
            [Target(GOODPUT, "goodput")],
            "The productive time of steps not redone over productive + every badput kind + the disruption between "
            "a job's processes (a crash, a restart), summed over the job's processes, over 5 minutes (the JAX "
            "training dashboard shows the badput by kind, disruption and redone steps included).",
            min=0,
            max=1,
            width=8,
        ),
    ],
)

DEVICES = Row(
    "Devices: speed and memory skew",
    [
        Panel(
            "Slowest devices",
            "bargauge",
            "percentunit",
            [Target(f"bottomk($k, jaxmon:device_speed:relative{{{JOB}}})", DEVICE + " ({{signal}})")],
            "The $k slowest devices of the job, each against the median of the job's devices of its kind "
            "(signal probe: FLOP/s of the probe on an idle device; sm_clock: NVML's SM clock). Under 0.85 for "
            "10 minutes fires JaxmonTrainingStraggler.",
            min=0,
            thresholds=SCORE_THRESHOLDS,
        ),
        Panel(
            "Memory skew: the most loaded devices",
            "bargauge",
            "none",
            [Target(f"topk($k, jaxmon:workload_device_memory_bytes:relative{{{JOB}}})", DEVICE)],
            "The $k devices holding the most of the workload's memory, over the job's median device (1: "
            "typical). Over 1.3 for 15 minutes fires JaxmonDeviceMemorySkew; the device far above the rest runs "
            "out of memory first.",
            min=0,
            thresholds=[(0, "green"), (1.15, "orange"), (1.3, "red")],
        ),
        Panel(
            "Memory per device: most, median, least",
            "timeseries",
            "bytes",
            [
                Target(f"max(jaxmon:workload_device_memory_bytes{{{JOB}}})", "most"),
                Target(f"quantile(0.5, jaxmon:workload_device_memory_bytes{{{JOB}}})", "median"),
                Target(f"min(jaxmon:workload_device_memory_bytes{{{JOB}}})", "least"),
            ],
            "The workload's memory on its devices (bytes in use, or live arrays where there is no allocator): a "
            "widening gap between most and median is skew growing.",
            min=0,
        ),
        Panel(
            "Energy per step",
            "timeseries",
            "joule",
            [Target(f"jaxmon:workload_energy_joules_per_step:rate5m{{{JOB}}}", "joules per step")],
            "The job's GPUs' power (NVML's energy counter; a GPU is the job's when a pod of the job holds it, on a "
            "node DaemonSet, or when the job reports to its jaxmon) over its step rate: what a step costs. Absent "
            "without NVML.",
            min=0,
        ),
        Panel(
            "Job alerts",
            "table",
            "none",
            [Target(f'topk($k, ALERTS{{{JOB_ALERTS}, alertstate="firing", {JOB}}})', table=True)],
            "The training and job-view alerts firing for this workload, with the process or device each names ($k "
            "at most).",
        ),
    ],
)


ROWS = [SUMMARY, THROUGHPUT, PROCESSES, DEVICES, links.ROW]
