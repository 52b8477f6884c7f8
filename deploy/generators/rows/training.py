"""The "Training" row: step time, throughput, MFU and goodput from jaxmon.step() inside each workload process."""

from __future__ import annotations

from ..panels import INST, WL, Panel, Row, Target, bottom, rate, top

PROCESS = "{{workload}} process {{process_index}}"
DEVICE = "{{workload}} process {{process_index}} {{platform}}:{{device}}"
BUCKETS = f"rate(jaxmon_training_step_duration_seconds_bucket{{{WL}}}[$__rate_interval])"
# Sampled traces come every collector.training.profile.every steps (every ~17 minutes at 1 s steps by default):
# their shares are read over an hour, as JaxmonTrainingCommunicationBound reads them.
PROFILE_WINDOW = "1h"
PROFILED = f"rate(jaxmon_training_profiled_seconds_total{{{WL}}}[{PROFILE_WINDOW}])"
EXPOSED = f'rate(jaxmon_training_profile_seconds_total{{{WL}, part="collective"}}[{PROFILE_WINDOW}])'

ROW = Row(
    "Training",
    [
        Panel(
            "Step time (p50, p90)",
            "timeseries",
            "s",
            [
                Target(f"histogram_quantile(0.5, sum by (workload, le) ({BUCKETS}))", "{{workload}} p50"),
                Target(f"histogram_quantile(0.9, sum by (workload, le) ({BUCKETS}))", "{{workload}} p90"),
                Target(
                    f"sum by (workload) ({rate('jaxmon_training_step_duration_seconds_sum', WL)}) / sum by (workload) "
                    f"({rate('jaxmon_training_step_duration_seconds_count', WL)})",
                    "{{workload}} mean",
                ),
            ],
            "Completion to completion of consecutive steps, all processes of a workload together (a synchronous "
            "job's step costs the slowest process's time).",
            min=0,
            width=8,
        ),
        Panel(
            "Steps per second",
            "timeseries",
            "ops",
            [Target(bottom(rate("jaxmon_training_steps_total", WL)), PROCESS)],
            "Completed training steps per second, per process.",
            min=0,
            width=8,
        ),
        Panel(
            "Tokens and examples per second",
            "timeseries",
            "short",
            [
                Target(f"sum by (workload) ({rate('jaxmon_training_tokens_total', WL)})", "{{workload}} tokens/s"),
                Target(f"sum by (workload) ({rate('jaxmon_training_examples_total', WL)})", "{{workload}} examples/s"),
            ],
            "The job's tokens and examples per second: every process passes the job's figures to jaxmon.step() and "
            "exports its share (÷ process count), so the sum over the workload's processes is the job's.",
            min=0,
            width=8,
        ),
        Panel(
            "MFU and HFU per device",
            "timeseries",
            "percentunit",
            [
                Target(bottom(f"jaxmon_training_model_flops_utilization_ratio{{{WL}}}"), DEVICE + " MFU"),
                Target(bottom(f"jaxmon_training_hardware_flops_utilization_ratio{{{WL}}}"), DEVICE + " HFU"),
            ],
            "Model (and XLA's hardware) FLOPs over the last window of steps, divided by the steps' time and the "
            "device's dense bf16 peak. HFU above MFU is remat or replicated work.",
            min=0,
            max=1,
        ),
        Panel(
            "Goodput, and badput by kind",
            "timeseries",
            "percentunit",
            [
                Target(
                    f"avg by (workload) ({rate('jaxmon_training_productive_seconds_total', WL)})",
                    "{{workload}} goodput",
                ),
                Target(
                    f"avg by (workload, kind) ({rate('jaxmon_training_badput_seconds_total', WL)})",
                    "{{workload}} {{kind}}",
                ),
            ],
            "Share of wall time that was productive training, and what took the rest (startup, compile, checkpoint, "
            "data, eval, restart, stall, your own kinds), averaged over the workload's processes while they run. "
            "The job's goodput, which also charges the time between a crashed process and its restart and the steps "
            "redone after a restore, is the job dashboard's (job.yml's jaxmon:training_goodput_ratio:rate5m).",
            min=0,
        ),
        Panel(
            "Loss",
            "timeseries",
            "short",
            [Target(top(f"jaxmon_training_loss{{{WL}}}"), PROCESS + " {{name}}")],
            "The scalars each process hands to jaxmon.step() (a scalar: loss; a dict of scalars: each key), read at "
            "most once a second from a looked-at step: the $k highest. A diverged loss is exported as read (NaN, "
            "+Inf), which a timeseries may leave as a gap.",
            width=24,
            height=6,
        ),
        Panel(
            "Host wait",
            "timeseries",
            "percentunit",
            [Target(top(rate("jaxmon_training_host_wait_seconds_total", WL)), PROCESS)],
            "Share of time the devices waited for the host to hand over the next step: a host-bound loop (input "
            "pipeline, Python overhead) reads high.",
            min=0,
            width=8,
        ),
        Panel(
            "FLOP/s per device",
            "timeseries",
            "flops",
            [
                Target(bottom(rate("jaxmon_training_model_flops_total", WL)), DEVICE + " model"),
                Target(bottom(rate("jaxmon_training_hardware_flops_total", WL)), DEVICE + " XLA"),
                Target(top(f"jaxmon_device_peak_flops_per_second{{{WL}}}"), DEVICE + " peak ({{origin}})"),
            ],
            "Model FLOPs (jaxmon.step(model_flops=) / device count) and XLA's counted FLOPs (jaxmon.track) per "
            "second, beside the device's peak.",
            min=0,
            width=8,
        ),
        Panel(
            "Bytes accessed per second",
            "timeseries",
            "Bps",
            [Target(top(rate("jaxmon_training_hardware_accessed_bytes_total", WL)), DEVICE)],
            "Bytes XLA counts as accessed by the tracked functions, per second, per device.",
            min=0,
            width=8,
        ),
        Panel(
            "Collective bytes per second",
            "timeseries",
            "Bps",
            [Target(top(rate("jaxmon_training_collective_bytes_total", WL)), DEVICE + " {{op}} [{{axes}}] {{link}}")],
            "Bytes the tracked functions' collectives move per second on each device, by op and the mesh axes "
            "their groups span (from the compiled HLO): the $k busiest.",
            min=0,
            width=8,
        ),
        Panel(
            "Predicted peak memory of the programs",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_training_program_peak_memory_bytes{{{WL}}}"), DEVICE)],
            "XLA's predicted peak memory (memory_analysis()) of the largest program the last window of steps "
            "called, per device: the $k highest. Compare with the allocator's limit in the Memory row.",
            min=0,
            width=8,
        ),
        Panel(
            "Last completed and dispatched step",
            "table",
            "none",
            [
                Target(bottom(f"jaxmon_training_step{{{WL}}}"), table=True),
                Target(bottom(f"jaxmon_training_dispatched_step{{{WL}}}"), table=True),
                Target(bottom(f"jaxmon_training_loss_step{{{WL}}}"), table=True),
            ],
            "Each process's last completed step, the last it handed to jaxmon.step() (a process behind the "
            "others in dispatching is the one a synchronous job waits for), and the step its loss is of.",
            width=8,
            height=6,
        ),
        Panel(
            "Seconds since the last step, and since start",
            "timeseries",
            "s",
            [
                Target(
                    top(f"time() - jaxmon_training_last_step_timestamp_seconds{{{WL}}}"), PROCESS + " since last step"
                ),
                Target(top(f"time() - jaxmon_training_start_time_seconds{{{WL}}}"), PROCESS + " running"),
            ],
            "How long ago each process completed its last step (a stalled one climbs), and how long its jaxmon has "
            "run.",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Tracking problems",
            "timeseries",
            "short",
            [
                Target(
                    "sum by (workload, reason) "
                    f"(increase(jaxmon_training_tracking_problems_total{{{INST}}}[$__rate_interval]))",
                    "{{workload}} {{reason}}",
                )
            ],
            "What the tracker could not use: step numbers that go back or jump, a donated ready array, too many "
            "steps pending, no cost analysis. Anything above 0 means some steps are missing from these panels.",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Exposed collective share (sampled traces)",
            "timeseries",
            "percentunit",
            [Target(f"sum by (workload) ({EXPOSED}) / sum by (workload) ({PROFILED})", "{{workload}}")],
            f"Time in collectives that no compute overlapped, over the sampled steps' time, over {PROFILE_WINDOW} "
            "(samples come every collector.training.profile.every steps). 15 % is XProf's highly "
            "communication-bound (JaxmonTrainingCommunicationBound); the JAX training dashboard has the rest.",
            min=0,
            thresholds=[(0, "green"), (0.03, "orange"), (0.15, "red")],
            width=8,
            height=6,
        ),
        Panel(
            "Collective time by op (sampled traces)",
            "timeseries",
            "percentunit",
            [
                Target(
                    "sum by (workload, op) (rate(jaxmon_training_profile_collective_seconds_total"
                    f"{{{WL}}}[{PROFILE_WINDOW}])) / on (workload) group_left () sum by (workload) ({PROFILED})",
                    "{{workload}} {{op}}",
                )
            ],
            f"Each collective kind's time, overlapped with compute or not, over the sampled steps' time, over "
            f"{PROFILE_WINDOW}.",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Least collective wait, last sample",
            "timeseries",
            "percentunit",
            [
                Target(
                    bottom(f"min by (workload, process_index, host) (jaxmon_training_collective_wait_ratio{{{WL}}})"),
                    PROCESS + " ({{host}})",
                )
            ],
            "The share of the last sampled trace's steps the process's least-waiting device spent waiting in "
            "collectives, for the $k processes that wait least. In a synchronous job the device that computes "
            "slowly waits least while the others wait for it (JaxmonTrainingComputeStraggler).",
            min=0,
            max=1,
            width=8,
            height=6,
        ),
        Panel(
            "Last sampled step",
            "timeseries",
            "none",
            [
                Target(f"max by (workload) (jaxmon_training_profile_sample_step{{{WL}}})", "{{workload}} newest"),
                Target(f"min by (workload) (jaxmon_training_profile_sample_step{{{WL}}})", "{{workload}} oldest"),
            ],
            "The first step of each process's last sampled trace: every process of a job traces the same step "
            "numbers, so the two lines meet once each has read its trace of the newest sample.",
            width=8,
            height=6,
        ),
        Panel(
            "Sampled traces (1h)",
            "timeseries",
            "short",
            [
                Target(
                    f"sum by (workload, result) (increase(jaxmon_training_profiles_total{{{INST}}}[{PROFILE_WINDOW}]))",
                    "{{workload}} {{result}}",
                )
            ],
            "Sampled traces in the last hour by result: taken; busy (the profiler was held: the user's trace or "
            "jaxmon's last); failed (the log says why).",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Steps a crash would redo",
            "timeseries",
            "short",
            [
                Target(
                    f"max by (workload) (jaxmon_training_step{{{WL}}}) - max by (workload) "
                    f"(jaxmon_training_last_checkpoint_step{{{WL}}})",
                    "{{workload}}",
                ),
                Target(
                    f"max by (workload) (jaxmon_training_checkpoint_interval_steps{{{WL}}})", "{{workload}} declared"
                ),
            ],
            "Steps completed since the step the last checkpoint holds (Orbax's saves, jaxmon.checkpointed()): what a "
            "crash now would compute again; beside it the interval in steps the job declared "
            "(collector.checkpoint.interval_steps: JaxmonTrainingCheckpointOverdue at 1.5 times it).",
            min=0,
            width=8,
            height=6,
        ),
        Panel(
            "Since the last checkpoint",
            "timeseries",
            "s",
            [
                Target(
                    f"time() - max by (workload) (jaxmon_training_last_checkpoint_timestamp_seconds{{{WL}}})",
                    "{{workload}}",
                ),
                Target(
                    f"max by (workload) (jaxmon_training_checkpoint_interval_seconds{{{WL}}})", "{{workload}} declared"
                ),
            ],
            "Seconds since the state of the job's last checkpoint was taken: the work a crash now would lose; beside "
            "it the interval the job declared (collector.checkpoint.interval: JaxmonTrainingCheckpointOverdue at 1.5 "
            "times it).",
            min=0,
            width=8,
            height=6,
        ),
    ],
)
