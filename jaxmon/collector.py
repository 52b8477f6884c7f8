"""Prometheus collector: fresh metric families from the latest snapshot on every collect (no device work)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from jaxmon.memory import MemoryNumbers
from jaxmon.model import DeviceInfo, MemoryReading, ProbeStatus, Snapshot


@dataclass(frozen=True)
class MemoryMetric:
    """One exported memory series: its name, type, help, and the MemoryNumbers field it reads."""

    name: str
    field: str
    help: str
    counter: bool = False


MEMORY_METRICS = (
    MemoryMetric("jaxmon_memory_bytes_in_use", "bytes_in_use", "Bytes allocated on the device (bytes_in_use)."),
    MemoryMetric(
        "jaxmon_memory_peak_bytes_in_use",
        "peak_bytes_in_use",
        "Highest bytes_in_use since the allocator started (peak_bytes_in_use; never resets).",
    ),
    MemoryMetric(
        "jaxmon_memory_limit_bytes",
        "limit_bytes",
        "Bytes the allocator may use (bytes_limit: total memory x memory fraction, not free memory).",
    ),
    MemoryMetric(
        "jaxmon_memory_pool_bytes",
        "pool_bytes",
        "Bytes the allocator actually obtained from the driver (pool_bytes; BFC allocator only).",
    ),
    MemoryMetric("jaxmon_memory_free_bytes", "free_bytes", "bytes_limit - bytes_in_use."),
    MemoryMetric(
        "jaxmon_memory_largest_free_block_bytes",
        "largest_free_block_bytes",
        "Largest contiguous free block in the obtained pool (largest_free_block_bytes); absent where the "
        "allocator does not track free blocks.",
    ),
    MemoryMetric(
        "jaxmon_memory_fragmentation_ratio",
        "fragmentation_ratio",
        "1 - largest_free_block / free memory in the pool (pool_bytes - bytes_in_use, or bytes_limit - "
        "bytes_in_use without a pool), in [0, 1]; 0 when nothing is free.",
    ),
    MemoryMetric(
        "jaxmon_memory_largest_allocatable_bytes",
        "largest_allocatable_bytes",
        "Estimated largest single allocation that can still succeed: max(largest_free_block, bytes_limit - "
        "pool_bytes) when the pool is known, else largest_free_block.",
    ),
    MemoryMetric(
        "jaxmon_memory_largest_alloc_bytes",
        "largest_alloc_bytes",
        "Largest single allocation seen so far (largest_alloc_size).",
    ),
    MemoryMetric(
        "jaxmon_memory_allocations",
        "allocations_total",
        "Allocations made since the allocator started (num_allocs).",
        counter=True,
    ),
)


@dataclass(frozen=True)
class ProbeMetric:
    """One exported probe series and how to read it from a ProbeStatus."""

    name: str
    help: str
    value: Callable[[ProbeStatus], float | None]
    counter: bool = False


def _opt(v: float | int | bool | None) -> float | None:
    return None if v is None else float(v)


PROBE_METRICS = (
    ProbeMetric(
        "jaxmon_device_up",
        "1 when the device answered its last probe within the timeout, 0 when it failed or timed out.",
        lambda p: _opt(p.up),
    ),
    ProbeMetric(
        "jaxmon_device_utilization_ratio",
        "ESTIMATED share of the device busy with other work, from probe slowdown: "
        "1 - probe_baseline_seconds / probe_duration_seconds, clamped to [0, 1].",
        lambda p: _opt(p.utilization_ratio) if p.up else None,
    ),
    ProbeMetric(
        "jaxmon_probe_duration_seconds",
        "Latency of the last completed probe run.",
        lambda p: _opt(p.last_duration_seconds),
    ),
    ProbeMetric(
        "jaxmon_probe_baseline_seconds",
        "Idle probe latency: the lower of the start-up calibration and the 10th percentile of recent runs.",
        lambda p: _opt(p.baseline_seconds),
    ),
    ProbeMetric(
        "jaxmon_probe_flops_per_second",
        "FLOP/s the last probe run achieved (compiled cost analysis x steps / latency).",
        lambda p: _opt(p.flops_per_second),
    ),
    ProbeMetric(
        "jaxmon_probe_memory_bytes",
        "Device memory the compiled probe uses (arguments + output + temporaries), allocated once.",
        lambda p: _opt(p.footprint_bytes),
    ),
    ProbeMetric(
        "jaxmon_probe_steps",
        "Matmul steps per probe run, chosen by calibration.",
        lambda p: float(p.steps) if p.calibrated else None,
    ),
    ProbeMetric("jaxmon_probe_runs", "Probe runs started.", lambda p: float(p.runs_total), counter=True),
    ProbeMetric(
        "jaxmon_probe_failures",
        "Probe runs that raised an error.",
        lambda p: float(p.failures_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_timeouts",
        "Probe runs that did not finish within the timeout.",
        lambda p: float(p.timeouts_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_skipped",
        "Scheduled probe runs skipped because the previous run was still in flight (a hung device).",
        lambda p: float(p.skipped_total),
        counter=True,
    ),
    ProbeMetric(
        "jaxmon_probe_busy_seconds",
        "Seconds of probe runs on the device; its rate() is the probe's duty cycle.",
        lambda p: float(p.busy_seconds_total),
        counter=True,
    ),
)


@dataclass(frozen=True)
class DeviceRow:
    """One device to render: its labels, identity, last reading and probe."""

    labels: dict[str, str]
    device: DeviceInfo
    reading: MemoryReading | None
    read_errors: int | None = None
    live_array_bytes: int | None = None
    probe: ProbeStatus | None = None


def device_rows(snap: Snapshot) -> list[DeviceRow]:
    """This process's devices (labelled with the workload in embedded mode), then every spooled workload's."""
    rows: list[DeviceRow] = []
    for d in snap.devices:
        labels = {"device": str(d.id), "platform": d.platform}
        if snap.workload is not None:
            labels["workload"] = snap.workload
        rows.append(
            DeviceRow(
                labels=labels,
                device=d,
                reading=snap.memory.get(d.key),
                read_errors=snap.memory_read_errors.get(d.key, 0),
                live_array_bytes=snap.live_array_bytes.get(d.key),
                probe=snap.probes.get(d.key),
            )
        )
    for w in snap.workloads:
        for wd in w.devices:
            labels = {"device": str(wd.info.id), "platform": wd.info.platform, "workload": w.workload}
            rows.append(DeviceRow(labels, wd.info, wd.reading, live_array_bytes=wd.live_array_bytes))
    # Never two samples with one label set, even if two reports claim the same device (e.g. two independent
    # processes under one workload name): the first (this process, then newest report) wins.
    unique: dict[frozenset[tuple[str, str]], DeviceRow] = {}
    for row in rows:
        unique.setdefault(frozenset(row.labels.items()), row)
    return list(unique.values())


def _family(name: str, help_text: str, counter: bool) -> Metric:
    return Metric(name, help_text, "counter" if counter else "gauge")


def _sample_name(family: Metric) -> str:
    return family.name + ("_total" if family.type == "counter" else "")


def _add(family: Metric, labels: dict[str, str], value: float) -> None:
    family.samples.append(Sample(_sample_name(family), labels, value))


def render_families(snap: Snapshot) -> Iterator[Metric]:
    """Every family for one snapshot; a missing number is an absent series, never 0 or NaN."""
    build = GaugeMetricFamily(
        "jaxmon_build_info",
        "jaxmon, jax, jaxlib and Python versions; always 1.",
        labels=["version", "jax_version", "jaxlib_version", "python_version"],
    )
    build.add_metric([snap.build.get(k, "") for k in ("version", "jax_version", "jaxlib_version", "python_version")], 1)
    yield build

    backend_up = GaugeMetricFamily(
        "jaxmon_backend_up",
        "1 when the JAX backend initialised, 0 when it failed (the log says why).",
        labels=["backend"],
    )
    for b in snap.backends:
        backend_up.add_metric([b.name], 1.0 if b.up else 0.0)
    yield backend_up

    rows = device_rows(snap)
    info = _family("jaxmon_device_info", "Identity of each device; always 1.", counter=False)
    for r in rows:
        d = r.device
        source = snap.source if "workload" not in r.labels or snap.workload is not None else "spool"
        _add(
            info,
            {
                **r.labels,
                "device_kind": d.device_kind,
                "process_index": str(d.process_index),
                "coords": d.coords or "",
                "core_on_chip": "" if d.core_on_chip is None else str(d.core_on_chip),
                "source": source,
            },
            1,
        )
    yield info

    yield from _memory_families(rows)
    yield from _probe_families(rows)
    yield from _workload_families(snap)
    yield from _collector_families(snap)


def _memory_families(rows: list[DeviceRow]) -> Iterator[Metric]:
    supported = _family(
        "jaxmon_memory_stats_supported",
        "1 when the device's allocator reports memory_stats(), 0 when it returns None (e.g. CPU).",
        counter=False,
    )
    read_ok = _family(
        "jaxmon_memory_read_success", "1 when the last memory_stats() call succeeded, 0 when it raised.", counter=False
    )
    read_errors = _family("jaxmon_memory_read_errors", "memory_stats() calls that raised.", counter=True)
    live = _family(
        "jaxmon_memory_live_array_bytes",
        "Bytes of live jax.Array shards on the device in the workload process, where memory_stats() reports "
        "nothing (each buffer counted once).",
        counter=False,
    )
    families = {m.name: _family(m.name, m.help, m.counter) for m in MEMORY_METRICS}
    # The hot loop (every number of every device): bind each family's sample list and sample name once.
    targets = [(m.field, families[m.name].samples.append, _sample_name(families[m.name])) for m in MEMORY_METRICS]
    for r in rows:
        if r.read_errors is not None:
            _add(read_errors, r.labels, float(r.read_errors))
        if r.live_array_bytes is not None:
            _add(live, r.labels, float(r.live_array_bytes))
        if r.reading is None:
            continue
        _add(read_ok, r.labels, 1.0 if r.reading.ok else 0.0)
        numbers: MemoryNumbers | None = r.reading.numbers
        if numbers is None:
            continue
        _add(supported, r.labels, 1.0 if numbers.supported else 0.0)
        for field, append, sample_name in targets:
            value = getattr(numbers, field)
            if value is not None:
                append(Sample(sample_name, r.labels, float(value)))
    yield supported
    yield read_ok
    yield read_errors
    yield live
    yield from families.values()


def _probe_families(rows: list[DeviceRow]) -> Iterator[Metric]:
    probed = [r for r in rows if r.probe is not None]
    if not probed:
        return
    families = {m.name: _family(m.name, m.help, m.counter) for m in PROBE_METRICS}
    targets = [(m.value, families[m.name].samples.append, _sample_name(families[m.name])) for m in PROBE_METRICS]
    for r in probed:
        assert r.probe is not None
        for read, append, sample_name in targets:
            value = read(r.probe)
            if value is not None:
                append(Sample(sample_name, r.labels, value))
    yield from families.values()


COMPILE_METRICS = (
    (
        "jaxmon_jit_compilations",
        "compilations",
        "XLA backend compilations in the workload (persistent-cache loads too).",
    ),
    ("jaxmon_jit_compile_seconds", "compile_seconds", "Seconds spent in XLA backend compilation in the workload."),
    ("jaxmon_compilation_cache_hits", "cache_hits", "Persistent compilation cache hits in the workload."),
    ("jaxmon_compilation_cache_misses", "cache_misses", "Persistent compilation cache misses (entries written)."),
)


def _workload_families(snap: Snapshot) -> Iterator[Metric]:
    compile_families = {key: _family(name, help_text, counter=True) for name, key, help_text in COMPILE_METRICS}
    if snap.workload is not None and snap.compile is not None:
        labels = {"workload": snap.workload, "process_index": str(snap.process_index)}
        for key, family in compile_families.items():
            _add(family, labels, float(snap.compile.get(key, 0.0)))
    info = _family("jaxmon_workload_info", "Each workload process reporting to the spool; always 1.", counter=False)
    last = _family(
        "jaxmon_workload_last_report_timestamp_seconds",
        "Unix time of the workload process's latest spool snapshot.",
        counter=False,
    )
    for w in snap.workloads:
        ident = {"workload": w.workload, "process_index": str(w.process_index)}
        _add(info, {**ident, "host": w.host, "pid": str(w.pid), "jax_version": w.jax_version}, 1)
        _add(last, ident, w.time)
        for key, family in compile_families.items():
            _add(family, ident, float(getattr(w.compile, key)))
    yield from compile_families.values()
    if snap.spool_rejected is not None:
        yield info
        yield last
        rejected = _family(
            "jaxmon_spool_rejected_files", "Spool files skipped because they are not what a publisher writes.", True
        )
        for reason, count in sorted(snap.spool_rejected.items()):
            _add(rejected, {"reason": reason}, float(count))
        yield rejected


def _collector_families(snap: Snapshot) -> Iterator[Metric]:
    success = GaugeMetricFamily(
        "jaxmon_collector_success",
        "1 when the collector's last run got all its data (memory: every device read; probe: every device answered).",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "jaxmon_collector_duration_seconds",
        "Time of the collector's last run (probe: device time of the last round).",
        labels=["collector"],
    )
    last = GaugeMetricFamily(
        "jaxmon_collector_last_success_timestamp_seconds",
        "Unix time of the collector's last successful run.",
        labels=["collector"],
    )
    for name, status in sorted(snap.collectors.items()):
        success.add_metric([name], 1.0 if status.success else 0.0)
        duration.add_metric([name], status.duration_seconds)
        if status.last_success_timestamp is not None:
            last.add_metric([name], status.last_success_timestamp)
    yield success
    yield duration
    yield last


class SnapshotCollector(Collector):
    """A prometheus_client collector over whatever `get_snapshot` returns."""

    def __init__(self, get_snapshot: Callable[[], Snapshot]) -> None:
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[Metric]:
        """Fresh families from the latest snapshot; families without samples are left out."""
        return (f for f in render_families(self._get_snapshot()) if f.samples)


class _OneFamily(Collector):
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        return iter((self._family,))


# The value format of generate_latest (Go's float formatting: 1.0, 2.147483648e+10, +Inf, NaN); untyped upstream.
_float_text = cast(Callable[[float], str], floatToGoString)


def _label_value(value: str) -> str:
    # prometheus_client escapes label values this way whatever the name escaping (openmetrics._escape, ALLOWUTF8).
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class TextFormat:
    """Writes families in the text format (0.0.4): byte for byte what prometheus_client's `generate_latest` writes.

    generate_latest sorts, validates, escapes and joins the labels of every sample and formats every value anew on
    each call. The label sets of a device stay the same from one snapshot to the next, and many values (limits,
    pool sizes, flags, step counts) do too, so this keeps both formatted strings between calls. Each cache is
    bounded by twice the samples of the last call: past that (values that keep changing) it starts again.
    Families other than plain gauges and counters (timestamps, exemplars, OpenMetrics-only samples) go through
    generate_latest itself.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[tuple[str, str], ...], str] = {}
        self._values: dict[float, str] = {}

    def _label_string(self, labels: dict[str, str]) -> str:
        text = ",".join(f'{openmetrics.escape_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels.items()))
        return "{" + text + "}" if text else ""

    def render(self, families: Iterable[Metric]) -> bytes:
        """The exposition of `families`."""
        label_cache, value_cache = self._labels, self._values
        samples = 0
        out: list[str] = []
        append = out.append
        for family in families:
            mtype = family.type
            sample_name = family.name + "_total" if mtype == "counter" else family.name
            if mtype not in ("gauge", "counter"):
                append(generate_latest(_OneFamily(family)).decode("utf-8"))
                continue
            start = len(out)
            name = openmetrics.escape_metric_name(sample_name)
            doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
            for s in family.samples:
                if s.name != sample_name or s.timestamp is not None or s.exemplar is not None or s.native_histogram:
                    del out[start:]  # not a plain sample: let generate_latest write the whole family
                    append(generate_latest(_OneFamily(family)).decode("utf-8"))
                    break
                key = tuple(s.labels.items())
                labels = label_cache.get(key)
                if labels is None:
                    labels = label_cache[key] = self._label_string(s.labels)
                value = s.value
                # Equal numbers format alike (1 == 1.0 == True -> "1.0"), except 0.0 and -0.0: zeros are not
                # cached. NaN is not stored (it equals nothing).
                text = value_cache.get(value) if value else None
                if text is None:
                    text = _float_text(value)
                    if value and value == value:
                        value_cache[value] = text
                append(f"{name}{labels} {text}\n")
            samples += len(family.samples)
        bound = 2 * samples + 256
        if len(label_cache) > bound:
            label_cache.clear()
        if len(value_cache) > bound:
            value_cache.clear()
        return "".join(out).encode("utf-8")
