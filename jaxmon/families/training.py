"""The training families: rendered for an embedded workload (training collector) and for spooled workloads."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.families import Spec, add, go_float
from jaxmon.training.reading import TrainingReading

STEPS = Spec("jaxmon_training_steps", "Training steps completed (jaxmon.step() calls seen through).", counter=True)
STEP = Spec("jaxmon_training_step", "The number of the last step jaxmon.step() reported and saw complete.")
DISPATCHED = Spec(
    "jaxmon_training_dispatched_step",
    "The number of the last step handed to jaxmon.step(), complete or not: in a synchronous job, a process whose "
    "number is behind the others' is the one they wait for.",
)
LAST_STEP = Spec(
    "jaxmon_training_last_step_timestamp_seconds",
    "Unix time the last step completed (as jaxmon's waiter saw it), read from the wall clock at that moment.",
)
DURATION = Spec(
    "jaxmon_training_step_duration_seconds",
    "Completion to completion of consecutive training steps (what a step costs the job, host time included); the "
    "same buckets in every process, so histograms sum across a job.",
)
EXAMPLES = Spec(
    "jaxmon_training_examples",
    "This process's share of the examples the job's steps processed: step(examples=...) (the job's global batch) / "
    "the job's process count, so that sum() over the job is the job's total.",
    counter=True,
)
TOKENS = Spec(
    "jaxmon_training_tokens",
    "This process's share of the tokens the job's steps processed: step(tokens=...) (the job's) / the job's process "
    "count, so that sum() over the job is the job's total.",
    counter=True,
)
MODEL_FLOPS = Spec(
    "jaxmon_training_model_flops",
    "Model FLOPs of the steps on this device: step(model_flops=...) (the whole job's) / jax.device_count().",
    counter=True,
)
HARDWARE_FLOPS = Spec(
    "jaxmon_training_hardware_flops",
    "FLOPs XLA counts for the tracked functions' programs on this device (cost analysis per compiled program, per "
    "device after SPMD; remat and replicated work included, a scan body counted once).",
    counter=True,
)
HARDWARE_BYTES = Spec(
    "jaxmon_training_hardware_accessed_bytes",
    "Bytes XLA counts as accessed by the tracked functions' programs on this device (cost analysis).",
    counter=True,
)
COLLECTIVE_BYTES = Spec(
    "jaxmon_training_collective_bytes",
    "Bytes the collectives of the tracked functions' programs moved on this device, by op (all-reduce, all-gather, "
    "reduce-scatter, all-to-all, collective-permute, ...) and the user's mesh axes their groups span (axes, "
    "comma-joined; empty without a mesh) and the slowest link their groups cross (link: local, nvlink, ici, pcie, "
    "sys, dcn, network, unknown): per call, from the compiled HLO (nccl-tests' convention: all-reduce, "
    "all-to-all, collective-permute the buffer, all-gather the gathered output, reduce-scatter the input; a loop "
    "body's collectives times its trip count); the calls made before jaxmon's thread has analysed the program are "
    "added once it has.",
    counter=True,
)
LINK_BANDWIDTH = Spec(
    "jaxmon_link_nominal_bandwidth_bytes_per_second",
    "Nominal bandwidth per direction of each link of this device's kind (nvlink, pcie, ici, dcn), from the vendor's "
    "figure (bidirectional ones halved, as nccl-tests compares bus bandwidth with one direction; sources in "
    "jaxmon/training/nominal.py): what the achieved bus bandwidth is compared with. None for a kind not in the table.",
)
PROGRAM_PEAK_MEMORY = Spec(
    "jaxmon_training_program_peak_memory_bytes",
    "The largest peak device memory XLA predicts (compile().memory_analysis()) for the tracked functions' "
    "programs the last window of steps called on this device: compare with jaxmon_memory_limit_bytes.",
)
PEAK = Spec(
    "jaxmon_device_peak_flops_per_second",
    "Dense bf16 peak FLOP/s of the device (label origin: table, by device kind; or setting: "
    "collector.training.peak_flops).",
)
MFU = Spec(
    "jaxmon_training_model_flops_utilization_ratio",
    "MFU over the last window of steps: model FLOPs on this device / (the steps' duration x the device's peak).",
)
HFU = Spec(
    "jaxmon_training_hardware_flops_utilization_ratio",
    "HFU over the last window of steps: XLA's FLOPs on this device / (the steps' duration x the device's peak).",
)
HOST_WAIT = Spec(
    "jaxmon_training_host_wait_seconds",
    "Time the devices waited for the host: how much later a step was handed to jaxmon.step() than the previous "
    "one completed (the host-bound signal).",
    counter=True,
)
START_TIME = Spec(
    "jaxmon_training_start_time_seconds",
    "Unix time the workload's jaxmon started (start() or publish()): the productive seconds and every kind of "
    "badput add up to jaxmon_training_last_step_timestamp_seconds minus it, unless the wall clock was stepped "
    "between the two (they are counted on the monotonic clock).",
)
PRODUCTIVE = Spec(
    "jaxmon_training_productive_seconds",
    "Time the devices computed steps, less stalls: the part of each step's interval after the host handed the step "
    "to jaxmon.step() (goodput = its increase over the increase of it plus every kind of badput).",
    counter=True,
)
BADPUT = Spec(
    "jaxmon_training_badput_seconds",
    "Time that was not training, by kind: startup (to the first completed step, less other kinds); inside the "
    "devices' idle time (from a step's completion until the next was handed to jaxmon.step()): compile, checkpoint "
    "(Orbax saves), restore (Orbax restores), the user's badput() kinds (data, eval, ...; other past the 10th), "
    "and host (the idle time nothing names); restart (around a step number that went back); stall (a step's busy "
    "time over stall_factor x the window median).",
    counter=True,
)
PROBLEMS = Spec(
    "jaxmon_training_tracking_problems",
    "What the training tracker could not use, by reason: back and jump (step numbers that do not follow), unready "
    "(a ready array deleted or donated first), invalid (a figure given to step() that is not a finite number >= 0, "
    "or a step number that is not an integer: dropped for that step), unread (a figure or step number array deleted "
    "or donated before it was read), dropped (too many steps pending), cost (no cost analysis), badput_kinds (a "
    "badput() block of a kind past the 10th, counted as other), intervals (closed badput intervals past 10 000 since "
    "the last completed step, dropped), programs (a tracked function's program whose cost was forgotten past 256 "
    "programs), communication (a program's HLO or memory analysis failed, or too many waited for it: that program "
    "adds no collective bytes nor peak memory), link_<why> (collectives whose link is not known: docs/placement.md), "
    "trace_ambiguous and trace_unnamed (sampled-trace events of an analysed collective instruction counted under "
    'link="unknown": analysed programs of the event\'s module name disagree on its place, or the trace does not say '
    "which program the event is of), error (a bug of the waiter's).",
    counter=True,
)
LOSS = Spec(
    "jaxmon_training_loss",
    "The loss the training loop handed to jaxmon.step() (a scalar array: name loss; a dict of scalar arrays: each "
    "key, the first 16 sorted), read on jaxmon's thread from the looked-at step at most once a second, as it is: "
    "NaN and +Inf are exported as read (a diverged loss is the news). Of the step jaxmon_training_loss_step names; "
    "absent until a loss was read.",
)
LOSS_STEP = Spec(
    "jaxmon_training_loss_step",
    "The number of the step jaxmon_training_loss's values are of (absent until a loss was read).",
)

PROFILED = Spec(
    "jaxmon_training_profiled_seconds",
    "Time of the steps the sampled traces held on this device (collector.training.profile: every `every` steps, "
    "`steps` whole steps, each the tracker's completion-to-completion interval): the sum of "
    "jaxmon_training_profile_seconds_total's parts.",
    counter=True,
)
PROFILE_PARTS = Spec(
    "jaxmon_training_profile_seconds",
    "Where the sampled steps' time went on this device, by part (the union of the device's op intervals, in this "
    "order of precedence): compute (any op not a collective or a copy running), collective (a collective running "
    "and no compute: exposed communication), copy (only host-device or device-device transfers), idle (nothing).",
    counter=True,
)
PROFILE_COLLECTIVES = Spec(
    "jaxmon_training_profile_collective_seconds",
    "Time a collective of this kind (op: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, "
    "...), mesh axes and link (jaxmon_training_collective_bytes_total's) ran on this device in the sampled steps, "
    "overlapped with compute or not (the union of each instruction's intervals, summed; an event of an "
    "instruction jaxmon did not analyse: axes empty, link unknown).",
    counter=True,
)
PROFILE_EXPOSED = Spec(
    "jaxmon_training_profile_exposed_collective_seconds",
    "Time collectives of this op, mesh axes and link ran on this device in the sampled steps with no compute "
    "running (exposed: what the step waited on them; collectives running at once each count it).",
    counter=True,
)
PROFILE_COLLECTIVE_BYTES = Spec(
    "jaxmon_training_profile_collective_bytes",
    "Bytes of the collectives of this op, mesh axes and link inside the sampled steps on this device: each traced "
    "event times its instruction's bytes per execution (the compiled HLO, nccl-tests' convention); "
    "rate(bytes) / rate(jaxmon_training_profile_collective_seconds_total) is the achieved bus bandwidth.",
    counter=True,
)
PROFILE_COPY_SECONDS = Spec(
    "jaxmon_training_profile_copy_seconds",
    "The copy part of jaxmon_training_profile_seconds_total (copies running and nothing else) on this device in the "
    "sampled steps, by direction: host_to_device, device_to_host, device_to_device (a GPU's MemcpyD2D and "
    "MemcpyP2P: the cross-device copy of an operation on arrays of two devices), other (a copy whose direction the "
    "trace does not say: a TPU's copy-start/copy-done); copies running at once each count it.",
    counter=True,
)
PROFILE_COPY_BYTES = Spec(
    "jaxmon_training_profile_copy_bytes",
    "Bytes of the copies of this direction that started inside the sampled steps on this device, where the trace "
    "says them (a GPU's memcpy events' size); none where it does not (CPU devices, TPUs).",
    counter=True,
)
COLLECTIVE_WAIT = Spec(
    "jaxmon_training_collective_wait_ratio",
    "The share of the last sampled trace's steps this device spent waiting in collectives (its collective part: a "
    "collective running and no compute, over the steps' time); jaxmon_training_profile_sample_step says which steps. "
    "In a synchronous job the device the others wait for waits least (JaxmonTrainingComputeStraggler).",
)
SAMPLE_STEP = Spec(
    "jaxmon_training_profile_sample_step",
    "The first step number of the last sampled trace taken, the steps jaxmon_training_collective_wait_ratio is of: "
    "every process of a job traces the same step numbers (absent before the first sample).",
)
PROFILES = Spec(
    "jaxmon_training_profiles",
    "Sampled traces by result: taken, busy (the user was profiling: jaxmon took none, or ended its own when the "
    "user's trace started), failed (no step of the block was traced whole, or the trace could not be read), "
    "skipped (the block's steps held named badput: an eval, a checkpoint, a compilation; tried again on the next "
    "clean steps).",
    counter=True,
)

# The labels and sources of the two families above, for docs/metrics.md (jaxmon.families.labels' table).
WAIT_LABELS_AND_SOURCE: dict[str, tuple[str, str]] = {
    "jaxmon_training_profile_sample_step": (
        "workload, process_index, process_count, host",
        "sampled traces: the block's first step (`collector.training.profile.every`)",
    ),
    "jaxmon_training_collective_wait_ratio": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "the last sampled trace: the device's collective part over the steps' time",
    ),
}


def training_labels(workload: str, process_index: int, process_count: int | None, host: str) -> dict[str, str]:
    """The labels of a workload process's training series: a job is `workload`, a member `process_index` (of
    `process_count`), on `host`."""
    labels = {"workload": workload, "process_index": str(process_index), "host": host}
    if process_count is not None:
        labels["process_count"] = str(process_count)
    return labels


def _histogram(fam: Metric, labels: dict[str, str], reading: TrainingReading) -> None:
    name = fam.name
    for bound, count in reading.duration_buckets:
        fam.samples.append(Sample(name + "_bucket", {**labels, "le": go_float(bound)}, float(count)))
    fam.samples.append(Sample(name + "_count", labels, float(reading.duration_count)))
    fam.samples.append(Sample(name + "_sum", labels, reading.duration_sum))


def training_families(rows: list[tuple[dict[str, str], TrainingReading]]) -> Iterator[Metric]:
    """The training families of (labels of the workload process, its reading) rows; per-device series add
    `device` and `platform`. A number that is not known is an absent series."""
    steps, step, last, examples, tokens = STEPS.new(), STEP.new(), LAST_STEP.new(), EXAMPLES.new(), TOKENS.new()
    dispatched = DISPATCHED.new()
    duration = Metric(DURATION.name, DURATION.help, "histogram")
    model, hardware, nbytes, peak, mfu, hfu = (
        s.new() for s in (MODEL_FLOPS, HARDWARE_FLOPS, HARDWARE_BYTES, PEAK, MFU, HFU)
    )
    host_wait, start_time, productive, badput, problems = (
        s.new() for s in (HOST_WAIT, START_TIME, PRODUCTIVE, BADPUT, PROBLEMS)
    )
    collective_bytes, peak_memory, bandwidth = COLLECTIVE_BYTES.new(), PROGRAM_PEAK_MEMORY.new(), LINK_BANDWIDTH.new()
    profiles, profiled, parts, profile_collectives, exposed, profile_bytes = (
        s.new()
        for s in (PROFILES, PROFILED, PROFILE_PARTS, PROFILE_COLLECTIVES, PROFILE_EXPOSED, PROFILE_COLLECTIVE_BYTES)
    )
    loss, loss_step = LOSS.new(), LOSS_STEP.new()
    copy_seconds, copy_bytes = PROFILE_COPY_SECONDS.new(), PROFILE_COPY_BYTES.new()
    wait, sample_step = COLLECTIVE_WAIT.new(), SAMPLE_STEP.new()
    for labels, r in rows:
        add(steps, labels, r.steps_total)
        if r.step is not None:
            add(step, labels, r.step)
        if r.dispatched_step is not None:
            add(dispatched, labels, r.dispatched_step)
        if r.last_step_timestamp is not None:
            add(last, labels, r.last_step_timestamp)
        if r.duration_buckets:
            _histogram(duration, labels, r)
        add(examples, labels, r.examples_total)
        add(tokens, labels, r.tokens_total)
        add(host_wait, labels, r.host_wait_seconds_total)
        add(start_time, labels, r.start_time_seconds)
        add(productive, labels, r.productive_seconds_total)
        for name, read in sorted(r.loss.items()):
            add(loss, {**labels, "name": name}, read)
        if r.loss and r.loss_step is not None:
            add(loss_step, labels, r.loss_step)
        for kind, seconds in sorted(r.badput_seconds_total.items()):
            add(badput, {**labels, "kind": kind}, seconds)
        for reason, count in sorted(r.problems.items()):
            add(problems, {**labels, "reason": reason}, count)
        for d in r.devices:
            per_device = {**labels, "device": str(d.id), "platform": d.platform}
            for fam, value in (
                (model, d.model_flops_total),
                (hardware, d.hardware_flops_total),
                (nbytes, d.hardware_bytes_total),
                (mfu, d.mfu),
                (hfu, d.hfu),
            ):
                if value is not None:
                    add(fam, per_device, value)
            if d.peak_flops is not None:
                add(peak, {**per_device, "origin": d.peak_source or "table"}, d.peak_flops)
            for (op, axes, link), moved in sorted(d.collective_bytes_total.items()):
                add(collective_bytes, {**per_device, "op": op, "axes": axes, "link": link}, moved)
            if d.program_peak_memory_bytes is not None:
                add(peak_memory, per_device, d.program_peak_memory_bytes)
            for link, value in sorted(d.link_bandwidth.items()):
                add(bandwidth, {**per_device, "link": link}, value)
        if r.profile is not None:
            for result, count in sorted(r.profile.results.items()):
                add(profiles, {**labels, "result": result}, count)
            if r.profile.sample_step is not None:
                add(sample_step, labels, r.profile.sample_step)
            for p in r.profile.devices:
                per_device = {**labels, "device": str(p.id), "platform": p.platform}
                add(profiled, per_device, p.profiled_seconds_total)
                if p.sample_wait_ratio is not None:
                    add(wait, per_device, p.sample_wait_ratio)
                for part, seconds in p.parts.items():
                    add(parts, {**per_device, "part": part}, seconds)
                # by place; a spool written before places were read: by op, axes "" and link unknown
                placed = p.placed or {(op, "", "unknown"): (t, 0.0, 0.0) for op, t in p.collectives.items()}
                for (op, axes, link), (seconds, hidden, moved) in sorted(placed.items()):
                    where = {**per_device, "op": op, "axes": axes, "link": link}
                    add(profile_collectives, where, seconds)
                    if p.placed:
                        add(exposed, where, hidden)
                        add(profile_bytes, where, moved)
                for direction, (seconds, moved) in sorted(p.copies.items()):
                    add(copy_seconds, {**per_device, "direction": direction}, seconds)
                    if moved:
                        add(copy_bytes, {**per_device, "direction": direction}, moved)
    yield from (steps, step, dispatched, last, duration, examples, tokens, model, hardware, nbytes, peak, mfu, hfu)
    yield from (loss, loss_step, host_wait, start_time, productive, badput, problems, collective_bytes, peak_memory)
    yield from (bandwidth, profiles, profiled, parts, profile_collectives, exposed, profile_bytes)
    yield from (copy_seconds, copy_bytes, sample_step, wait)
