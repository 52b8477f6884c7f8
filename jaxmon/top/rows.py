"""`jaxmon top`'s data: rows per (endpoint, platform, device, workload) read from a jaxmon exposition."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from jaxmon.catalog import metrics as c

# Allocator numbers, keyed by device, platform and (for spooled or embedded workloads) workload.
_ALLOCATOR = {
    c.MEMORY_BYTES_IN_USE.exposed: "in_use",
    c.MEMORY_LIVE_ARRAY_BYTES.exposed: "live",
    c.MEMORY_LIMIT_BYTES.exposed: "limit",
    c.MEMORY_FREE_BYTES.exposed: "free",
    c.MEMORY_RESERVED_BYTES.exposed: "reserved",
    c.MEMORY_FRAGMENTATION_RATIO.exposed: "fragmentation",
    c.MEMORY_LARGEST_ALLOCATABLE_BYTES.exposed: "allocatable",
    c.MEMORY_READ_SUCCESS.exposed: "read_ok",
    c.DEVICE_UP.exposed: "up",
    c.DEVICE_UTILIZATION_RATIO.exposed: "probe",
}
# A training workload process's numbers (jaxmon.step()), shown on the rows of its devices.
_TRAINING = {
    c.TRAINING_STEP.exposed: "step",
    c.TRAINING_STEP_DURATION_SECONDS.name + "_sum": "sum",
    c.TRAINING_STEP_DURATION_SECONDS.name + "_count": "count",
    c.TRAINING_DISPATCHED_STEP.exposed: "dispatched",
    c.TRAINING_HOST_WAIT_SECONDS.exposed: "wait",
    c.TRAINING_START_TIME_SECONDS.exposed: "start",
    c.TRAINING_LAST_STEP_TIMESTAMP_SECONDS.exposed: "last",
    c.TRAINING_PRODUCTIVE_SECONDS.exposed: "productive",
    c.TRAINING_TOKENS.exposed: "tokens",
}
# Summed over its kinds: with productive, the workload's time from its start to its last completion on its own
# monotonic clock (the two timestamps are the wall clock's, which may have been stepped in between).
_BADPUT = c.TRAINING_BADPUT_SECONDS.exposed
# Device-wide numbers (NVML, libtpu): one per physical device, shown on every row of that device.
_DEVICE_WIDE = {
    c.DEVICE_DUTY_CYCLE_RATIO.exposed: "duty",
    c.DEVICE_MEMORY_USED_BYTES.exposed: "device_used",
    c.DEVICE_MEMORY_TOTAL_BYTES.exposed: "device_total",
}


@dataclass(frozen=True, order=True)
class RowKey:
    """What a row stands for: one device of one endpoint, as one workload (or the daemon itself: '') sees it."""

    endpoint: str
    platform: str
    device: str
    workload: str


@dataclass
class Row:
    """The numbers of one row; None where the exposition has no series (shown as a dash, never as 0)."""

    key: RowKey
    kind: str | None = None
    in_use: float | None = None
    live: float | None = None  # live jax.Array bytes: a workload's only memory number where memory_stats() is None
    limit: float | None = None
    free: float | None = None
    reserved: float | None = None  # the allocator's stack (TPU): programs' temporaries, not free for arrays
    fragmentation: float | None = None
    allocatable: float | None = None
    read_ok: float | None = None
    up: float | None = None
    probe: float | None = None
    duty: float | None = None
    duty_source: str | None = None
    device_used: float | None = None
    device_total: float | None = None
    # Training (jaxmon.step() in the row's workload): its process's last step, the step time (mean of the steps
    # since the previous scrape, else since start) and this device's MFU.
    step: float | None = None
    step_sum: float | None = None
    step_count: float | None = None
    step_time: float | None = None
    mfu: float | None = None
    # Its process's loss: the value named `loss`, else the first name's in sorted order.
    loss: float | None = None
    # The row's process in its job (jaxmon.step()'s process_index), the last step it handed to step(), and the
    # share of time its devices waited for its host (since the previous scrape, else since its jaxmon started).
    process_index: str | None = None
    dispatched: float | None = None
    host_wait: float | None = None
    elapsed: float | None = None
    host_wait_ratio: float | None = None
    # Goodput (productive over productive + every badput), tokens per second of the process's share, and its
    # largest badput kind with that kind's share of the time: since the previous scrape, else since start.
    productive: float | None = None
    tokens: float | None = None
    badput: dict[str, float] = field(default_factory=dict)
    goodput: float | None = None
    tokens_per_second: float | None = None
    top_badput: tuple[str, float] | None = None
    slowest: bool = False  # the row's process is its job's slowest (jaxmon.top.jobs), set for each frame
    sources_down: tuple[str, ...] = ()  # device-wide sources that failed for this device in their last poll
    # Set when the endpoint did not answer: the row is the last known device, its numbers cleared.
    endpoint_down: str | None = None

    @property
    def used_ratio(self) -> float | None:
        """(in_use + reserved) / limit, where in_use and a positive limit are known: what arrays and programs'
        reservations hold (no reservation reported: in_use alone)."""
        if self.in_use is None or not self.limit:
            return None
        return (self.in_use + (self.reserved or 0.0)) / self.limit

    @property
    def memory_bytes(self) -> float | None:
        """Bytes in use by the allocator, else bytes of live arrays (CPU devices, where memory_stats() is None)."""
        return self.in_use if self.in_use is not None else self.live


@dataclass(frozen=True)
class ProcessRow:
    """One compute process on a device, as NVML lists it (c.PROCESS_DEVICE_MEMORY_BYTES)."""

    endpoint: str
    platform: str
    device: str
    pid: str
    workload: str  # '' where no workload report has this pid
    used: float


@dataclass
class Scrape:
    """What one scrape of /metrics says: the rows, and the daemon-wide health series."""

    rows: list[Row] = field(default_factory=list)
    collectors: dict[str, float] = field(default_factory=dict)  # c.COLLECTOR_SUCCESS by collector
    # c.DEVICE_SOURCE_UP: per source, (devices it answered for, devices it covers).
    sources: dict[str, tuple[int, int]] = field(default_factory=dict)
    processes: list[ProcessRow] = field(default_factory=list)  # c.PROCESS_DEVICE_MEMORY_BYTES (NVML)


class ScrapeError(ValueError):
    """A scrape that gave no exposition: an HTTP error status, or text that is not one."""


def _numeric(label: str) -> tuple[int, str]:
    """Sort devices and pids numerically where they are numbers ('10' after '9')."""
    return (int(label), "") if label.isdigit() else (1 << 62, label)


def parse_exposition(text: str, endpoint: str) -> Scrape:
    """Rows and health series of an exposition, parsed with prometheus_client's parser."""
    rows: dict[RowKey, Row] = {}
    device_wide: dict[tuple[str, str], dict[str, tuple[float, str]]] = {}
    # (workload, process_index) -> the training numbers of that process; which process a row's device is in.
    training: dict[tuple[str, str], dict[str, float]] = {}
    process_of: dict[RowKey, str] = {}
    kinds: dict[tuple[str, str], dict[str, float]] = {}  # each process's badput seconds by kind
    losses: dict[tuple[str, str], dict[str, float]] = {}  # each process's loss by name
    source_failures: dict[tuple[str, str], list[str]] = {}
    out = Scrape()

    def row(labels: dict[str, str]) -> Row:
        key = RowKey(endpoint, labels.get("platform", ""), labels.get("device", ""), labels.get("workload", ""))
        return rows.setdefault(key, Row(key))

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as exc:  # the parser raises ValueError (TypeError for some malformed lines)
        raise ScrapeError(f"not a Prometheus exposition: {exc}") from exc
    for family in families:
        for s in family.samples:
            if s.name in _ALLOCATOR and "device" in s.labels:
                setattr(row(s.labels), _ALLOCATOR[s.name], s.value)
            elif s.name == c.DEVICE_INFO.exposed and "device" in s.labels:
                r = row(s.labels)
                r.kind = s.labels.get("device_kind") or None
                process_of[r.key] = s.labels.get("process_index", "")
            elif s.name in _TRAINING and "workload" in s.labels:
                per_process = training.setdefault((s.labels["workload"], s.labels.get("process_index", "")), {})
                per_process[_TRAINING[s.name]] = s.value
            elif s.name == _BADPUT and "workload" in s.labels:
                process = (s.labels["workload"], s.labels.get("process_index", ""))
                per_process = training.setdefault(process, {})
                per_process["badput"] = per_process.get("badput", 0.0) + s.value
                kinds.setdefault(process, {})[s.labels.get("kind", "")] = s.value
            elif s.name == c.TRAINING_LOSS.exposed and "workload" in s.labels:
                process = (s.labels["workload"], s.labels.get("process_index", ""))
                losses.setdefault(process, {})[s.labels.get("name", "")] = s.value
            elif s.name == c.TRAINING_MODEL_FLOPS_UTILIZATION_RATIO.exposed and "device" in s.labels:
                row(s.labels).mfu = s.value
            elif s.name in _DEVICE_WIDE and "device" in s.labels:
                per_device = device_wide.setdefault((s.labels.get("platform", ""), s.labels["device"]), {})
                per_device[_DEVICE_WIDE[s.name]] = (s.value, s.labels.get("source", ""))
            elif s.name == c.PROCESS_DEVICE_MEMORY_BYTES.exposed and "pid" in s.labels:
                platform, device, workload = (s.labels.get(k, "") for k in ("platform", "device", "workload"))
                out.processes.append(ProcessRow(endpoint, platform, device, s.labels["pid"], workload, s.value))
            elif s.name == c.COLLECTOR_SUCCESS.exposed and "collector" in s.labels:
                out.collectors[s.labels["collector"]] = s.value
            elif s.name == c.DEVICE_SOURCE_UP.exposed and "source" in s.labels:
                up, total = out.sources.get(s.labels["source"], (0, 0))
                out.sources[s.labels["source"]] = (up + (s.value == 1), total + 1)
                if s.value != 1 and "device" in s.labels:
                    failed = source_failures.setdefault((s.labels.get("platform", ""), s.labels["device"]), [])
                    failed.append(s.labels["source"])
    for (platform, device), failed in source_failures.items():
        for r in [r for r in rows.values() if (r.key.platform, r.key.device) == (platform, device)]:
            r.sources_down = tuple(sorted(failed))
    for (platform, device), values in device_wide.items():
        matching = [r for r in rows.values() if (r.key.platform, r.key.device) == (platform, device)]
        if not matching:  # a device only NVML or libtpu sees (no JAX client on it): a row of its own
            matching = [row({"platform": platform, "device": device})]
        for r in matching:
            for attr, (value, source) in values.items():
                setattr(r, attr, value)
                if attr == "duty":
                    r.duty_source = source or None
    for r in rows.values():
        if not r.key.workload:
            continue
        # The row's own process where its device's info says which; else the workload's one process.
        mine = [(p, v) for (w, p), v in training.items() if w == r.key.workload and p == process_of.get(r.key, p)]
        if len(mine) == 1:
            r.process_index, numbers = mine[0]
            r.step, r.step_sum, r.step_count = (numbers.get(k) for k in ("step", "sum", "count"))
            r.dispatched, r.host_wait = numbers.get("dispatched"), numbers.get("wait")
            start, last = numbers.get("start"), numbers.get("last")
            productive, badput = numbers.get("productive"), numbers.get("badput")
            # The workload's own clock: its accounting's time from the start to the last completion (host wait
            # is counted at completions too), productive plus every badput; the timestamps' difference where those
            # are missing (it takes in any step of the wall clock between them).
            if productive is not None and badput is not None:
                r.elapsed = productive + badput
            else:
                r.elapsed = last - start if start is not None and last is not None else None
            if r.step_sum is not None and r.step_count:
                r.step_time = r.step_sum / r.step_count
            if r.host_wait is not None and r.elapsed:
                r.host_wait_ratio = min(r.host_wait / r.elapsed, 1.0)
            r.productive, r.tokens = productive, numbers.get("tokens")
            r.badput = kinds.get((r.key.workload, r.process_index), {})
            if loss := losses.get((r.key.workload, r.process_index)):
                r.loss = loss["loss"] if "loss" in loss else loss[min(loss)]
            _throughput(r, r.productive, r.tokens, r.badput, r.elapsed)
    out.rows = sorted(rows.values(), key=SORTS["device"])
    return out


def _throughput(
    r: Row, productive: float | None, tokens: float | None, badput: dict[str, float], elapsed: float | None
) -> None:
    """The row's goodput, tokens/s and largest badput kind over `elapsed` seconds of its workload's clock."""
    if productive is not None and elapsed:
        r.goodput = min(max(productive / elapsed, 0.0), 1.0)
        r.tokens_per_second = None if tokens is None else tokens / elapsed
        kind, seconds = max(badput.items(), key=lambda kv: kv[1], default=("", 0.0))
        r.top_badput = (kind, seconds / elapsed) if seconds > 0 else None


def _wait_share(now: tuple[float | None, float | None], before: tuple[float | None, float | None]) -> float | None:
    """(host wait, elapsed) now and before: the share of the time between that was host wait."""
    (wait, elapsed), (was_wait, was_elapsed) = now, before
    if wait is None or elapsed is None or was_wait is None or was_elapsed is None:
        return None
    if elapsed <= was_elapsed or wait < was_wait:  # a restarted workload: its counters began again
        return None
    return min((wait - was_wait) / (elapsed - was_elapsed), 1.0)


def recent_step_times(new: Scrape, old: Scrape | None) -> None:
    """Each row's step time over the steps completed since `old` (the previous scrape), where there were some, and
    its host-wait share over the workload's own clock since then (its last completion less its start time)."""
    if old is None:
        return
    before = {r.key: (r.step_sum, r.step_count) for r in old.rows}
    waited = {r.key: (r.host_wait, r.elapsed) for r in old.rows}
    was = {r.key: r for r in old.rows}
    for r in new.rows:
        share = _wait_share((r.host_wait, r.elapsed), waited.get(r.key, (None, None)))
        if share is not None:
            r.host_wait_ratio = share
        prev = was.get(r.key)
        if prev is not None and None not in (r.elapsed, prev.elapsed, r.productive, prev.productive):
            assert r.elapsed is not None and prev.elapsed is not None
            assert r.productive is not None and prev.productive is not None
            if r.elapsed > prev.elapsed and r.productive >= prev.productive:  # else: a restart, or no step since
                tokens = None if r.tokens is None or prev.tokens is None else r.tokens - prev.tokens
                badput = {k: v - prev.badput.get(k, 0.0) for k, v in r.badput.items()}
                _throughput(r, r.productive - prev.productive, tokens, badput, r.elapsed - prev.elapsed)
        was_sum, was_count = before.get(r.key, (None, None))
        if None in (r.step_sum, r.step_count, was_sum, was_count):
            continue
        assert r.step_sum is not None and r.step_count is not None and was_sum is not None and was_count is not None
        if r.step_count > was_count:
            r.step_time = (r.step_sum - was_sum) / (r.step_count - was_count)


def down_rows(last_known: Iterable[Row], reason: str) -> list[Row]:
    """The rows of an endpoint that stopped answering: the devices it last had, numbers cleared."""
    return [Row(r.key, kind=r.kind, endpoint_down=reason) for r in last_known]


def _desc(value: float | None) -> float:
    """Sort key putting high values first and absent values last."""
    return -value if value is not None else float("inf")


def _asc(value: float | None) -> float:
    """Sort key putting low values first and absent values last."""
    return value if value is not None else float("inf")


def _by_device(r: Row) -> tuple[object, ...]:
    return (r.key.endpoint, _numeric(r.key.device), r.key.platform, r.key.workload)


# Each sort puts the rows a person would look at first on top, ties broken by device.
SORTS: dict[str, Callable[[Row], tuple[object, ...]]] = {
    "device": _by_device,
    # Share of the limit first; rows with no limit (live arrays on CPU devices) after them, by bytes.
    "memory": lambda r: (_desc(r.used_ratio), _desc(r.memory_bytes), *_by_device(r)),
    "free": lambda r: (_asc(r.free), *_by_device(r)),
    "fragmentation": lambda r: (_desc(r.fragmentation), *_by_device(r)),
    "duty": lambda r: (_desc(r.duty if r.duty is not None else r.probe), *_by_device(r)),
}
SORT_NAMES = tuple(SORTS)


def next_sort(name: str) -> str:
    """The sort after `name` in the cycle the sort key walks."""
    return SORT_NAMES[(SORT_NAMES.index(name) + 1) % len(SORT_NAMES)]


def sort_rows(rows: Iterable[Row], name: str) -> list[Row]:
    """Rows in the order of the named sort."""
    return sorted(rows, key=SORTS[name])


def sort_processes(processes: Iterable[ProcessRow]) -> list[ProcessRow]:
    """Largest device memory first, ties by endpoint, device and pid."""
    return sorted(processes, key=lambda p: (-p.used, p.endpoint, _numeric(p.device), p.platform, _numeric(p.pid)))
