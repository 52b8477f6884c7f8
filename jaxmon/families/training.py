"""The training families: rendered for an embedded workload (training collector) and for spooled workloads."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from jaxmon.catalog import metrics
from jaxmon.families import add, go_float
from jaxmon.training_readings import TrainingReading


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
    c = metrics
    steps, step, dispatched = c.TRAINING_STEPS.new(), c.TRAINING_STEP.new(), c.TRAINING_DISPATCHED_STEP.new()
    last, duration = c.TRAINING_LAST_STEP_TIMESTAMP_SECONDS.new(), c.TRAINING_STEP_DURATION_SECONDS.new()
    examples, tokens = c.TRAINING_EXAMPLES.new(), c.TRAINING_TOKENS.new()
    model, hardware = c.TRAINING_MODEL_FLOPS.new(), c.TRAINING_HARDWARE_FLOPS.new()
    nbytes, peak = c.TRAINING_HARDWARE_ACCESSED_BYTES.new(), c.DEVICE_PEAK_FLOPS_PER_SECOND.new()
    mfu, hfu = c.TRAINING_MODEL_FLOPS_UTILIZATION_RATIO.new(), c.TRAINING_HARDWARE_FLOPS_UTILIZATION_RATIO.new()
    host_wait, start_time = c.TRAINING_HOST_WAIT_SECONDS.new(), c.TRAINING_START_TIME_SECONDS.new()
    productive, badput = c.TRAINING_PRODUCTIVE_SECONDS.new(), c.TRAINING_BADPUT_SECONDS.new()
    problems, collective_bytes = c.TRAINING_TRACKING_PROBLEMS.new(), c.TRAINING_COLLECTIVE_BYTES.new()
    peak_memory = c.TRAINING_PROGRAM_PEAK_MEMORY_BYTES.new()
    bandwidth = c.LINK_NOMINAL_BANDWIDTH_BYTES_PER_SECOND.new()
    profiles, profiled = c.TRAINING_PROFILES.new(), c.TRAINING_PROFILED_SECONDS.new()
    parts, profile_collectives = c.TRAINING_PROFILE_SECONDS.new(), c.TRAINING_PROFILE_COLLECTIVE_SECONDS.new()
    exposed = c.TRAINING_PROFILE_EXPOSED_COLLECTIVE_SECONDS.new()
    profile_bytes = c.TRAINING_PROFILE_COLLECTIVE_BYTES.new()
    loss, loss_step = c.TRAINING_LOSS.new(), c.TRAINING_LOSS_STEP.new()
    copy_seconds, copy_bytes = c.TRAINING_PROFILE_COPY_SECONDS.new(), c.TRAINING_PROFILE_COPY_BYTES.new()
    wait, sample_step = c.TRAINING_COLLECTIVE_WAIT_RATIO.new(), c.TRAINING_PROFILE_SAMPLE_STEP.new()
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
