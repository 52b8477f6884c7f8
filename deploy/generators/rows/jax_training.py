"""The "JAX training" dashboard's rows, for the ML engineer: one job (a `workload`) as a whole (step time, tokens/s,
MFU, goodput and badput, compilation) and its worst processes and devices (stragglers, memory headroom), each of
those the `$k` worst, so the dashboard reads the same at 4 processes as at 4,096."""

from __future__ import annotations

from ..panels import Panel, Row, Target, bottom, top

JOB = 'workload="$workload"'
PROCESS = "process {{process_index}} ({{host}})"
DEVICE = "process {{process_index}} {{platform}}:{{device}}"
# Goodput's window: long enough that a checkpoint or an eval does not swing it, short enough to see one.
WINDOW = "5m"


def rate(metric: str, window: str = "$__rate_interval") -> str:
    return f"rate({metric}{{{JOB}}}[{window}])"


def job_sum(metric: str, window: str = "$__rate_interval") -> str:
    """The job's rate of a counter each process exports its share of."""
    return f"sum({rate(metric, window)})"


BUCKETS = rate("jaxmon_training_step_duration_seconds_bucket")
# job.yml's records (docs/job-rules.md): goodput and each badput kind's share over 5 minutes, tokens/s over 1.
GOODPUT = f"jaxmon:training_goodput_ratio:rate{WINDOW}{{{JOB}}}"
BADPUT_SHARES = f"jaxmon:training_badput_ratio:rate{WINDOW}{{{JOB}}}"
MFU = f"jaxmon_training_model_flops_utilization_ratio{{{JOB}}}"
HFU = f"jaxmon_training_hardware_flops_utilization_ratio{{{JOB}}}"
TOKENS = f"jaxmon:training_tokens_per_second:rate1m{{{JOB}}}"
EXAMPLES = f"jaxmon:training_examples_per_second:rate1m{{{JOB}}}"
SCORE_THRESHOLDS = [(0, "red"), (0.5, "orange"), (0.85, "green")]


def stat(title: str, unit: str, expr: str, description: str, **kwargs: object) -> Panel:
    return Panel(title, "stat", unit, [Target(expr, title)], description, width=4, height=4, **kwargs)  # type: ignore[arg-type]


SUMMARY = Row(
    "The job",
    [
        stat(
            "Tokens per second",
            "short",
            TOKENS,
            "The job's tokens per second over a minute: the sum of its processes' shares.",
        ),
        stat(
            "Median step time",
            "s",
            f"histogram_quantile(0.5, sum by (le) ({BUCKETS}))",
            "The median step of all the job's processes over the rate interval.",
        ),
        stat("MFU", "percentunit", f"avg({MFU})", "Model FLOPs utilization, the mean over the job's devices.", min=0),
        stat(
            "Goodput",
            "percentunit",
            GOODPUT,
            f"The productive time of steps not redone over the job's time (productive, every badput kind, and the "
            f"disruption between its processes), over {WINDOW}.",
            min=0,
            max=1,
            thresholds=[(0, "red"), (0.5, "orange"), (0.8, "green")],
        ),
        stat(
            "Lowest host score",
            "percentunit",
            f"min(jaxmon:training_host_score{{{JOB}}})",
            "The straggler's host score from deploy/prometheus/job.yml (1: as busy as the median process).",
            min=0,
            max=1,
            thresholds=SCORE_THRESHOLDS,
        ),
        stat(
            "Processes",
            "none",
            f"count(jaxmon_training_last_step_timestamp_seconds{{{JOB}}})",
            "Processes of the job that export training series.",
        ),
    ],
)

THROUGHPUT = Row(
    "Step time and throughput",
    [
        Panel(
            "Step time (p50, p90, mean)",
            "timeseries",
            "s",
            [
                Target(f"histogram_quantile(0.5, sum by (le) ({BUCKETS}))", "p50"),
                Target(f"histogram_quantile(0.9, sum by (le) ({BUCKETS}))", "p90"),
                Target(
                    f"{job_sum('jaxmon_training_step_duration_seconds_sum')} / "
                    f"{job_sum('jaxmon_training_step_duration_seconds_count')}",
                    "mean",
                ),
            ],
            "Completion to completion of consecutive steps, every process of the job together: the median and 90th "
            "percentile from the step histogram, and the mean.",
            min=0,
            width=8,
        ),
        Panel(
            "Tokens and examples per second (the job)",
            "timeseries",
            "short",
            [
                Target(TOKENS, "tokens/s"),
                Target(EXAMPLES, "examples/s"),
            ],
            "Every process passes the job's figures to jaxmon.step() and exports its share (÷ process count), so "
            "the sum over the job's processes is the job's (job.yml's jaxmon:training_tokens_per_second:rate1m and "
            "examples).",
            min=0,
            width=8,
        ),
        Panel(
            "Steps per second",
            "timeseries",
            "ops",
            [
                Target(f"avg({rate('jaxmon_training_steps_total')})", "job (mean over processes)"),
                Target(bottom(rate("jaxmon_training_steps_total")), PROCESS),
            ],
            "The job's step rate, and the $k processes stepping slowest (apart from the mean only in an "
            "asynchronous job).",
            min=0,
            width=8,
        ),
    ],
)

LOSS = f"jaxmon_training_loss{{{JOB}}}"
LOSS_ROW = Row(
    "Loss",
    [
        Panel(
            "Loss by name",
            "timeseries",
            "short",
            [
                Target(f"avg by (name) ({LOSS})", "{{name}} (mean over processes)"),
                Target(top(LOSS), "{{name}} " + PROCESS),
            ],
            "The scalars the loop hands to jaxmon.step() (a scalar: loss; a dict of scalars: each key), read on "
            "jaxmon's thread from a looked-at step at most every 0.5 s: the job's mean by name, and the $k highest "
            "processes' values. A diverged loss is exported as it was read, NaN or +Inf, which a timeseries may leave "
            "as a gap.",
            width=20,
        ),
        stat(
            "Loss of step",
            "none",
            f"max(jaxmon_training_loss_step{{{JOB}}})",
            "The step the newest loss values are of (jaxmon_training_loss_step, the latest over the job's processes): "
            "a few steps behind jaxmon_training_step, as the loss is read at most every 0.5 s.",
        ),
    ],
)

EFFICIENCY = Row(
    "MFU, goodput and badput",
    [
        Panel(
            "MFU and HFU",
            "timeseries",
            "percentunit",
            [
                Target(f"avg({MFU})", "MFU (mean)"),
                Target(f"avg({HFU})", "HFU (mean)"),
                Target(bottom(MFU), DEVICE + " MFU"),
            ],
            "Model (and XLA's hardware) FLOPs over the last window of steps, divided by the steps' time and the "
            "device's peak: the job's mean, and the $k devices with the lowest MFU. HFU above MFU is remat or "
            "replicated work.",
            min=0,
            max=1,
        ),
        Panel(
            "Goodput",
            "timeseries",
            "percentunit",
            [Target(GOODPUT, "goodput")],
            f"The productive time of steps not redone / the job's time, summed over its processes, over {WINDOW} "
            "(job.yml's jaxmon:training_goodput_ratio:rate5m). The job's time is productive + every badput kind + "
            "the disruption between a job's processes (from one's last step to the next one's start: a crash, a "
            "restart); the steps redone after a restore (since the checkpoint it restored) are taken out of the "
            "productive time.",
            min=0,
            max=1,
            width=6,
        ),
        Panel(
            "Badput by kind",
            "timeseries",
            "percentunit",
            [Target(f"sum by (kind) ({BADPUT_SHARES})", "{{kind}}")],
            f"Each badput kind's share of the accounted time over {WINDOW} (startup, compile, checkpoint, restore, "
            "data, eval, restart, stall, your own kinds), stacked: the stack is 1 - goodput.",
            min=0,
            width=6,
            stack=True,
        ),
    ],
)

COMPILATION = Row(
    "Compilation",
    [
        Panel(
            "Share of time compiling",
            "timeseries",
            "percentunit",
            [
                Target(f"avg({rate('jaxmon_jit_compile_seconds_total')})", "job (mean over processes)"),
                Target(top(rate("jaxmon_jit_compile_seconds_total")), PROCESS),
            ],
            "Seconds of XLA backend compilation per second of wall time: the job's mean and the $k processes "
            "compiling most. Steady compiling after warm-up is a recompilation storm.",
            min=0,
            width=8,
        ),
        Panel(
            "Compilations per minute",
            "timeseries",
            "cpm",
            [Target(f"{job_sum('jaxmon_jit_compilations_total')} * 60", "job")],
            "XLA backend compilations of all the job's processes.",
            min=0,
            width=8,
        ),
        Panel(
            "Compilation cache hits and misses",
            "timeseries",
            "ops",
            [
                Target(job_sum("jaxmon_compilation_cache_hits_total"), "hits"),
                Target(job_sum("jaxmon_compilation_cache_misses_total"), "misses"),
            ],
            "The persistent compilation cache's hits and misses (entries written) per second, over the job.",
            min=0,
            width=8,
        ),
    ],
)

STRAGGLERS = Row(
    "Stragglers (deploy/prometheus/job.yml)",
    [
        Panel(
            "Lowest host scores",
            "bargauge",
            "percentunit",
            [Target(bottom(f"jaxmon:training_host_score{{{JOB}}}"), PROCESS)],
            "The $k processes whose host keeps their devices busy least, against the job's median process. Under "
            "0.5 for 10 minutes fires JaxmonTrainingStraggler.",
            min=0,
            max=1,
            thresholds=SCORE_THRESHOLDS,
            width=8,
        ),
        Panel(
            "Lowest step scores",
            "bargauge",
            "percentunit",
            [Target(bottom(f"jaxmon:training_step_score{{{JOB}}}"), PROCESS)],
            "The job's median step time over each process's own (1: as fast as the median): the $k slowest "
            "processes (apart only in an asynchronous job).",
            min=0,
            max=1,
            thresholds=SCORE_THRESHOLDS,
            width=8,
        ),
        Panel(
            "Slowest devices",
            "bargauge",
            "percentunit",
            [
                Target(
                    bottom(f"jaxmon:device_speed:relative{{{JOB}}}"),
                    "{{instance}} {{platform}}:{{device}} ({{signal}})",
                )
            ],
            "The $k slowest devices of the job against the median of its devices of their kind (signal probe, "
            "sm_clock or sm_active). Under 0.85 for 10 minutes fires JaxmonTrainingStraggler.",
            min=0,
            thresholds=SCORE_THRESHOLDS,
            width=8,
        ),
    ],
)

MEMORY = Row(
    "Memory headroom",
    [
        Panel(
            "Least OOM headroom",
            "timeseries",
            "bytes",
            [Target(bottom(f"jaxmon_memory_largest_allocatable_bytes{{{JOB}}}"), DEVICE)],
            "The $k devices of the job with the smallest largest allocation that can still succeed: the first to "
            "run out of memory.",
            min=0,
            width=8,
        ),
        Panel(
            "Fullest devices (in use / limit)",
            "timeseries",
            "percentunit",
            [
                Target(
                    top(f"jaxmon_memory_bytes_in_use{{{JOB}}} / (jaxmon_memory_limit_bytes{{{JOB}}} > 0)"),
                    DEVICE,
                )
            ],
            "The $k devices of the job with the largest share of their allocator's limit in use; "
            "JaxmonMemoryNearLimit fires above 95 % for 15 minutes.",
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.95, "red")],
            width=8,
        ),
        Panel(
            "Memory skew: the most loaded devices",
            "bargauge",
            "none",
            [
                Target(
                    top(f"jaxmon:workload_device_memory_bytes:relative{{{JOB}}}"),
                    "{{instance}} {{platform}}:{{device}}",
                )
            ],
            "The $k devices holding the most of the job's memory over its median device (1: typical). Over 1.3 for "
            "15 minutes fires JaxmonDeviceMemorySkew.",
            min=0,
            thresholds=[(0, "green"), (1.15, "orange"), (1.3, "red")],
            width=8,
        ),
        Panel(
            "Replicated array bytes",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_memory_replicated_array_bytes{{{JOB}}}"), DEVICE)],
            "The $k devices of the job holding the most bytes of arrays fully replicated over several devices "
            "(parameters, optimizer state): what sharding them over the mesh would save. Embedded jaxmon only.",
            min=0,
            width=12,
        ),
        Panel(
            "Host-offloaded array bytes",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_memory_host_array_bytes{{{JOB}}} > 0"), DEVICE + " {{memory_kind}}")],
            "The $k largest amounts of live arrays in host memory kinds (pinned_host, unpinned_host) per device: "
            "offloaded optimizer state and activations, which the device's allocator does not count. Embedded "
            "jaxmon only.",
            min=0,
            width=12,
        ),
    ],
)


def communication_panels() -> list[Panel]:
    """The tracked programs' communication and predicted peak memory (jaxmon.track(), from the compiled HLO): a
    part of the "Where the step goes" row, kept in its own function so the row can gather it with the profile's."""
    # Each device's bytes per step of its own process, then the mean over the job's devices by mesh axes (a
    # process's steps and its devices' bytes share every label but the device's and the collective's).
    per_device_step = (
        f"sum without (op) ({rate('jaxmon_training_collective_bytes_total')}) "
        f"/ ignoring (device, platform, axes, link) group_left () {rate('jaxmon_training_steps_total')}"
    )
    peak = f"jaxmon_training_program_peak_memory_bytes{{{JOB}}}"
    limit = f"(jaxmon_memory_limit_bytes{{{JOB}}} > 0)"
    return [
        Panel(
            "Collective bytes per step by mesh axis",
            "timeseries",
            "bytes",
            [
                Target(
                    f'label_replace(avg by (axes) ({per_device_step}), "axes", "(no mesh)", "axes", "")',
                    "{{axes}}",
                )
            ],
            "Bytes the collectives of the tracked programs move per step on each device (the mean over the job's "
            "devices), by the mesh axes their groups span (nccl-tests' convention, from the compiled HLO). An axis "
            "whose bytes dominate is the one to place on the fastest links, or to shard less over.",
            min=0,
            width=8,
        ),
        Panel(
            "Predicted peak memory beside the limit",
            "timeseries",
            "bytes",
            [
                Target(f"max({peak})", "predicted peak (largest device)"),
                Target(f"min({limit})", "allocator limit (smallest device)"),
            ],
            "XLA's predicted peak memory of the programs the last window of steps called (memory_analysis()), "
            "the largest over the job's devices, beside the smallest allocator limit: a peak near the limit is "
            "an OOM waiting for the next batch-size or sequence-length change.",
            min=0,
            width=8,
        ),
        Panel(
            "Predicted peak / limit: the fullest devices",
            "timeseries",
            "percentunit",
            [Target(top(f"{peak} / ignoring (process_index, process_count, host) {limit}"), DEVICE)],
            "The $k devices whose programs' predicted peak is the largest share of their allocator's limit "
            "(where the allocator reports one: not on CPU).",
            min=0,
            thresholds=[(0, "green"), (0.9, "orange"), (1.0, "red")],
            width=8,
        ),
    ]


# Sampled traces come every collector.training.profile.every steps (1000: every ~17 minutes at 1 s steps), so
# their shares are read over an hour, as JaxmonTrainingCommunicationBound reads them.
PROFILE_WINDOW = "1h"
PROFILED = rate("jaxmon_training_profiled_seconds_total", PROFILE_WINDOW)
PARTS = rate("jaxmon_training_profile_seconds_total", PROFILE_WINDOW)
EXPOSED = rate('jaxmon_training_profile_seconds_total{part="collective"}', PROFILE_WINDOW).replace("}{", ",")
DEVICE_KEY = "process_index, host, platform, device"
DEVICE_SHARE = f"sum by ({DEVICE_KEY}) ({EXPOSED}) / sum by ({DEVICE_KEY}) ({PROFILED})"  # each device's exposed share


def profile_panels() -> list[Panel]:
    """Where each sampled step's time went (the sampled traces, docs/training.md): the other part of the row."""
    return [
        Panel(
            "Where the step goes (the job)",
            "timeseries",
            "percentunit",
            [Target(f"sum by (part) ({PARTS}) / on () group_left () sum({PROFILED})", "{{part}}")],
            f"The sampled steps' time over {PROFILE_WINDOW}, all the job's devices together, by part: compute, "
            "collective (exposed: a collective and no compute running), copy (transfers only), idle. Stacked: the "
            "stack is 1.",
            min=0,
            max=1,
            width=5,
            stack=True,
        ),
        Panel(
            "Where the step goes: the most communication-bound devices",
            "bargauge",
            "percentunit",
            [
                Target(
                    f"sum by ({DEVICE_KEY}, part) ({PARTS}) / on ({DEVICE_KEY}) group_left () "
                    f"sum by ({DEVICE_KEY}) ({PROFILED}) and on ({DEVICE_KEY}) topk($k, {DEVICE_SHARE})",
                    DEVICE + " {{part}}",
                )
            ],
            f"The four parts of the sampled steps' time over {PROFILE_WINDOW} (they sum to 1 per device) of the $k "
            "devices with the largest exposed collective share.",
            min=0,
            max=1,
            width=5,
        ),
        Panel(
            "Exposed collective share",
            "timeseries",
            "percentunit",
            [
                Target(f"sum({EXPOSED}) / sum({PROFILED})", "job"),
                Target(
                    f"topk($k, sum by (process_index, host) ({EXPOSED}) / sum by (process_index, host) ({PROFILED}))",
                    PROCESS,
                ),
            ],
            f"Exposed collective time over the sampled steps' time, over {PROFILE_WINDOW}: the job's and the $k "
            "highest processes'. At 15 % for 30 minutes (XProf's highly communication-bound) a process fires "
            "JaxmonTrainingCommunicationBound.",
            min=0,
            thresholds=[(0, "green"), (0.03, "orange"), (0.15, "red")],
            width=5,
        ),
        Panel(
            "Collective time by op",
            "timeseries",
            "percentunit",
            [
                Target(
                    f"sum by (op) ({rate('jaxmon_training_profile_collective_seconds_total', PROFILE_WINDOW)}) "
                    f"/ on () group_left () sum({PROFILED})",
                    "{{op}}",
                ),
            ],
            f"Each collective kind's time (overlapped with compute or not) as a share of the sampled steps' time, "
            f"over {PROFILE_WINDOW}, all the job's devices together.",
            min=0,
            width=5,
        ),
        Panel(
            "Sampled traces (1h)",
            "bargauge",
            "short",
            [
                Target(
                    f"sum by (result) (increase(jaxmon_training_profiles_total{{{JOB}}}[{PROFILE_WINDOW}]))",
                    "{{result}}",
                )
            ],
            "The job's sampled traces in the last hour by result: taken; busy (the user was profiling: jaxmon took "
            "none, or gave way to the user's trace; or its own last trace was still stopping); failed (no step of the "
            "block traced whole: the log says why).",
            min=0,
            width=4,
        ),
    ]


WHERE_THE_STEP_GOES = Row("Where the step goes", [*profile_panels(), *communication_panels()])

ROWS = [SUMMARY, THROUGHPUT, LOSS_ROW, EFFICIENCY, WHERE_THE_STEP_GOES, COMPILATION, STRAGGLERS, MEMORY]
