"""The metric catalog: every family jaxmon exports, declared once, as data (as dcgm-exporter's field list is).

Each entry is a module constant named after its family (the name without `jaxmon_`, upper-cased) and says all there
is to say of it once: its name (without `_total`), type, HELP, the labels every series carries, the labels some
series carry and when (`extra`), where its number comes from, which collectors render it and in which modes
(`where`), and, for the counters a workload exports before they happen, the keys they are born with at zero
(`zeros`). Its unit is the one its name ends in (Prometheus naming) unless it says otherwise.

Everything else is read from here: collectors render with `FAMILY.new()`, jaxmon.births fills in `zeros`, the
metrics reference (jaxmon.families.reference, docs/metrics.md) is generated, `jaxmon top` reads families by their
constants, and the tests hold every exposition to it (`undeclared`: a family the catalog lacks, or a label it does
not declare, fails tests/unit/test_catalog.py and every end-to-end scrape).

Adding a family: one entry here, in its collector's section, then render it with `ENTRY.new()`; regenerate
docs/metrics.md with `python -m jaxmon.families.reference`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

GAUGE, COUNTER, HISTOGRAM, SUMMARY = "gauge", "counter", "histogram", "summary"

# Where jaxmon runs: inside the training process (`jaxmon.start()`); a workload that publishes to a spool
# (`jaxmon.publish()`), whose families a daemon's spool collector serves; a daemon reading this host's JAX devices
# (`jaxmon serve`, a sidecar); a daemon without JAX (`jaxmon serve --node`, a DaemonSet).
EMBEDDED, PUBLISHER, SIDECAR, NODE = "embedded", "publisher", "sidecar", "node"
MODES = (EMBEDDED, PUBLISHER, SIDECAR, NODE)

# A sample's labels a family's type adds (a histogram's buckets, a summary's quantiles).
TYPE_LABELS = {HISTOGRAM: ("le",), SUMMARY: ("quantile",)}
# The names a family's samples carry, by type.
SUFFIXES = {
    GAUGE: ("",),
    COUNTER: ("_total", "_created"),
    HISTOGRAM: ("_bucket", "_count", "_sum", "_created"),
    SUMMARY: ("", "_count", "_sum", "_created"),
}


@dataclass(frozen=True)
class Extra:
    """Labels some series of a family carry, and when (empty: where the owner transform or the reading has them)."""

    labels: tuple[str, ...]
    when: str = ""


@dataclass(frozen=True)
class Where:
    """Which collectors render a family (the first one's section of the reference lists it) and in which modes."""

    collectors: tuple[str, ...]
    modes: tuple[str, ...]
    section: str = ""  # the reference's section, when not the first collector's name


@dataclass(frozen=True)
class Zeros:
    """A counter born at zero before its first event: its series with each of `keys` as its `label` (none: the
    series of each workload process itself, a histogram's every bucket)."""

    label: str = ""
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """One exported family."""

    name: str  # without `_total`
    type: str  # GAUGE, COUNTER, HISTOGRAM or SUMMARY
    help: str
    labels: tuple[str, ...]  # on every series
    source: str  # where its number comes from (markdown, for the reference)
    where: Where
    extra: tuple[Extra, ...] = ()
    zeros: Zeros | None = None
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, +Inf aside
    unit: str = ""  # by default the one its name ends in (Prometheus naming); a dash for a count or a state

    def __post_init__(self) -> None:
        if not self.unit:
            object.__setattr__(self, "unit", next((u for suffix, u in UNITS if self.name.endswith(suffix)), "—"))

    @property
    def counter(self) -> bool:
        """Whether it is a counter."""
        return self.type == COUNTER

    @property
    def exposed(self) -> str:
        """The name its samples carry (`_total` for a counter; a histogram's and a summary's suffixes aside)."""
        return self.name + ("_total" if self.type == COUNTER else "")

    @property
    def collectors(self) -> tuple[str, ...]:
        """The collectors that render it."""
        return self.where.collectors

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes that export it."""
        return self.where.modes

    @property
    def label_names(self) -> frozenset[str]:
        """Every label a series of it may carry (its type's own aside)."""
        return frozenset(self.labels).union(*(e.labels for e in self.extra))

    def zeros_keys(self) -> tuple[str, ...]:
        """The values of its `zeros.label` its series are born with at zero (none where it has no such label)."""
        return self.zeros.keys if self.zeros is not None else ()

    def new(self) -> Metric:
        """A fresh, empty family to render."""
        return Metric(self.name, self.help, self.type)


# A family's unit: the one its name ends in (Prometheus naming), the longest first.
UNITS = (
    ("_flops_per_second", "FLOP/s"),
    ("_bytes_per_second", "bytes/s"),
    ("_timestamp_seconds", "Unix seconds"),
    ("_time_seconds", "Unix seconds"),
    ("_seconds", "seconds"),
    ("_bytes", "bytes"),
    ("_ratio", "ratio (0-1)"),
    ("_watts", "watts"),
    ("_joules", "joules"),
    ("_celsius", "°C"),
    ("_hertz", "hertz"),
    ("_flops", "FLOPs"),
    ("_info", "1 (info)"),
)

# Label sets many families share.
_DEVICE = ("device", "platform")  # a JAX device (its id), or a device-wide source's device with `source`
_DEVICE_WIDE = ("device", "platform", "source")
_PROCESS = ("workload", "process_index", "host")  # a workload process's training series
_PROCESS_DEVICE = (*_DEVICE, *_PROCESS)
_OWNERS = Extra(("pod", "namespace", "container"))  # the owner transform's (jaxmon.ownership.owners)
_WORKLOAD = Extra(("workload",), "a workload's: embedded, spooled")
_PROBE_WORKLOAD = Extra(("workload",), "embedded")
_PID_WORKLOAD = Extra(("workload",), "where a workload reports that pid")
_PROCESS_COUNT = Extra(("process_count",), "not from a schema-1 publisher")
_MIG = Extra(("mig_uuid", "gpu_instance", "compute_instance", "profile"), "a MIG GPU instance's")
_LINKS = Extra(("link",), "with `--collector.nvml.nvlink-links`")

_ALL = (EMBEDDED, SIDECAR, NODE)  # every exporter; a publisher exports through a daemon's spool
_EXPOSITION = Where(("exposition",), _ALL)
_JAX_EXPOSITION = Where(("exposition",), (EMBEDDED, SIDECAR))  # a node daemon has no JAX backend
_STOPPING = Where(("exposition",), (EMBEDDED,))
_DEVICE_INFO = Where(("exposition", "spool", "nvml"), (EMBEDDED, PUBLISHER, SIDECAR, NODE))
_WORKLOAD_INFO = Where(("exposition", "spool"), (EMBEDDED, PUBLISHER))
_MEMORY = Where(("memory", "spool"), (EMBEDDED, PUBLISHER, SIDECAR))
_PROBE = Where(("probe",), (EMBEDDED, SIDECAR))
_COMPILE = Where(("compile", "spool"), (EMBEDDED, PUBLISHER))
_TRAINING = Where(("training", "spool"), (EMBEDDED, PUBLISHER))
_CHECKPOINT = Where(("checkpoint", "spool"), (EMBEDDED, PUBLISHER))
_SPOOL = Where(("spool",), (SIDECAR, NODE))
_NVML = Where(("nvml",), _ALL)
_DEVICE_WIDE_SOURCES = Where(("nvml", "tpu"), _ALL)
_TPU = Where(("tpu",), (SIDECAR, NODE))
_TPU_SDK = Where(("tpu",), (SIDECAR, NODE), section="tpu (libtpu's monitoring SDK)")
_KUBERNETES = Where(("kubernetes",), _ALL)
_SLURM = Where(("slurm",), _ALL)

# The step histogram's bounds: the same in every process, so that histograms sum across a job.
_DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 150.0, 300.0, 600.0,
)  # fmt: skip
# What the training tracker counts as a problem (jaxmon_training_tracking_problems' reasons born at 0).
_PROBLEM_REASONS = (
    "back", "jump", "unready", "invalid", "unread", "dropped", "cost", "badput_kinds", "intervals", "programs",
    "communication", "error",
)  # fmt: skip

# exposition

BUILD_INFO = Family(
    "jaxmon_build_info",
    GAUGE,
    "jaxmon, jax, jaxlib and Python versions; always 1.",
    ("version", "jax_version", "jaxlib_version", "python_version"),
    "package metadata",
    _EXPOSITION,
)
BACKEND_UP = Family(
    "jaxmon_backend_up",
    GAUGE,
    "1 when the JAX backend initialised, 0 when it failed (the log says why).",
    ("backend",),
    "JAX",
    _JAX_EXPOSITION,
)
COLLECTOR_SUCCESS = Family(
    "jaxmon_collector_success",
    GAUGE,
    "1 when the collector's last run got all its data (memory: every device read; probe: every device answered).",
    ("collector",),
    "—",
    _EXPOSITION,
)
COLLECTOR_DURATION_SECONDS = Family(
    "jaxmon_collector_duration_seconds",
    GAUGE,
    "Time of the collector's last run (probe: device time of the last round).",
    ("collector",),
    "—",
    _EXPOSITION,
)
COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS = Family(
    "jaxmon_collector_last_success_timestamp_seconds",
    GAUGE,
    "Unix time of the collector's last successful run.",
    ("collector",),
    "—",
    _EXPOSITION,
)
EXPORTER_STOPPING = Family(
    "jaxmon_exporter_stopping",
    GAUGE,
    (
        "1 once the embedded exporter is stopping on purpose (jaxmon.stop(), the Exporter's stop(), or the "
        "interpreter's exit without an uncaught exception), 0 while it runs and when the process ends by an exception "
        "or a signal: its last scrape tells a job that finished from one that died. Only in a workload process "
        "(jaxmon.start())."
    ),
    (),
    "`jaxmon.stop()`, the `Exporter`'s `stop()`, the interpreter's exit",
    _STOPPING,
)
EXPORTER_EXIT_INFO = Family(
    "jaxmon_exporter_exit_info",
    GAUGE,
    (
        "How the workload process is ending, served by the embedded exporter's last scrapes: reason normal "
        "(jaxmon.stop(), the interpreter's exit), exception (an uncaught exception) or signal (SIGTERM, SIGINT: label "
        "signal); always 1, absent while it runs. A process killed outright (SIGKILL, the OOM killer) says nothing. "
        "Only in a workload process (jaxmon.start())."
    ),
    ("reason", "signal"),
    "the interpreter's exit, `sys.excepthook`, jaxmon's SIGTERM handler",
    _STOPPING,
)
DEVICE_INFO = Family(
    "jaxmon_device_info",
    GAUGE,
    "Identity of each device; always 1.",
    _DEVICE_WIDE,
    "JAX device attributes; NVML",
    _DEVICE_INFO,
    extra=(
        Extra(("device_kind", "process_index", "coords", "core_on_chip"), "a JAX device's"),
        Extra(("workload",), "a workload's device"),
        Extra(("uuid", "pci_bus_id", "name", "device_match"), '`source="nvml"`'),
        Extra(_OWNERS.labels, 'where not `source="spool"`'),
    ),
)
WORKLOAD_INFO = Family(
    "jaxmon_workload_info",
    GAUGE,
    (
        "Each workload process reporting (to the spool, or an embedded exporter itself), with where the scheduler "
        "put it (pod, namespace, node, slurm_job_id where set); always 1."
    ),
    (*_PROCESS, "pid", "jax_version"),
    "spool; the process",
    _WORKLOAD_INFO,
    extra=(
        Extra(("pod", "namespace", "node", "slurm_job_id"), "where set"),
        Extra(("container",), "the owner transform's, by pid, where no pod is set"),
    ),
)

# memory

MEMORY_BYTES_IN_USE = Family(
    "jaxmon_memory_bytes_in_use",
    GAUGE,
    "Bytes allocated on the device (bytes_in_use).",
    _DEVICE,
    "`bytes_in_use`",
    _MEMORY,
    unit="bytes",
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_PEAK_BYTES_IN_USE = Family(
    "jaxmon_memory_peak_bytes_in_use",
    GAUGE,
    "Highest bytes_in_use since the allocator started (peak_bytes_in_use; never resets).",
    _DEVICE,
    "`peak_bytes_in_use`",
    _MEMORY,
    unit="bytes",
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_LIMIT_BYTES = Family(
    "jaxmon_memory_limit_bytes",
    GAUGE,
    "Bytes the allocator may use (bytes_limit: total memory x memory fraction, not free memory).",
    _DEVICE,
    "`bytes_limit`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_POOL_BYTES = Family(
    "jaxmon_memory_pool_bytes",
    GAUGE,
    "Bytes the allocator actually obtained from the driver (pool_bytes; BFC allocator only).",
    _DEVICE,
    "`pool_bytes`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_FREE_BYTES = Family(
    "jaxmon_memory_free_bytes",
    GAUGE,
    "What a new array can get: bytes_limit - bytes_in_use - bytes_reserved (the reservation is 0 or absent on GPU).",
    _DEVICE,
    "derived",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_LARGEST_FREE_BLOCK_BYTES = Family(
    "jaxmon_memory_largest_free_block_bytes",
    GAUGE,
    (
        "Largest contiguous free block in the obtained pool (largest_free_block_bytes); absent where the allocator "
        "does not track free blocks."
    ),
    _DEVICE,
    "`largest_free_block_bytes`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_FRAGMENTATION_RATIO = Family(
    "jaxmon_memory_fragmentation_ratio",
    GAUGE,
    (
        "1 - largest_free_block / free memory in the pool (pool_bytes - bytes_in_use, or bytes_limit - bytes_in_use "
        "- bytes_reserved without a pool), in [0, 1]; 0 when nothing is free."
    ),
    _DEVICE,
    "derived",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_LARGEST_ALLOCATABLE_BYTES = Family(
    "jaxmon_memory_largest_allocatable_bytes",
    GAUGE,
    (
        "Estimated largest single allocation that can still succeed: max(largest_free_block, bytes_limit - "
        "pool_bytes - bytes_reserved) when the pool is known, else largest_free_block."
    ),
    _DEVICE,
    "derived",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_LARGEST_ALLOC_BYTES = Family(
    "jaxmon_memory_largest_alloc_bytes",
    GAUGE,
    "Largest single allocation seen so far (largest_alloc_size).",
    _DEVICE,
    "`largest_alloc_size`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_ALLOCATIONS = Family(
    "jaxmon_memory_allocations",
    COUNTER,
    "Allocations made since the allocator started (num_allocs).",
    _DEVICE,
    "`num_allocs`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_RESERVED_BYTES = Family(
    "jaxmon_memory_reserved_bytes",
    GAUGE,
    (
        "Bytes reserved for programs' temporaries on the allocator's stack, at the other end of memory from the "
        "arrays (bytes_reserved; TPU). Not free for new arrays. Absent where the allocator keeps no stack (GPU)."
    ),
    _DEVICE,
    "`bytes_reserved`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_PEAK_RESERVED_BYTES = Family(
    "jaxmon_memory_peak_reserved_bytes",
    GAUGE,
    "Highest bytes_reserved since the allocator started (peak_bytes_reserved; never resets; TPU).",
    _DEVICE,
    "`peak_bytes_reserved`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_RESERVABLE_LIMIT_BYTES = Family(
    "jaxmon_memory_reservable_limit_bytes",
    GAUGE,
    (
        "Upper limit of the stack's reservations (bytes_reservable_limit; TPU): bytes_limit less what the arrays' "
        "end of memory holds."
    ),
    _DEVICE,
    "`bytes_reservable_limit`",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_STATS_SUPPORTED = Family(
    "jaxmon_memory_stats_supported",
    GAUGE,
    "1 when the device's allocator reports memory_stats(), 0 when it returns None (e.g. CPU).",
    _DEVICE,
    "—",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_READ_SUCCESS = Family(
    "jaxmon_memory_read_success",
    GAUGE,
    "1 when the last memory_stats() call succeeded, 0 when it raised.",
    _DEVICE,
    "—",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_READ_ERRORS = Family(
    "jaxmon_memory_read_errors",
    COUNTER,
    "memory_stats() calls that raised.",
    _DEVICE,
    "—",
    _MEMORY,
    extra=(_WORKLOAD, _OWNERS),
)
MEMORY_LIVE_ARRAY_BYTES = Family(
    "jaxmon_memory_live_array_bytes",
    GAUGE,
    (
        "Bytes of live jax.Array shards in the device's memory in the workload process, where memory_stats() reports "
        "nothing (each array's shard counted once; host memory kinds are in jaxmon_memory_host_array_bytes)."
    ),
    (*_DEVICE, "workload"),
    "`jax.live_arrays()`",
    _MEMORY,
    extra=(_OWNERS,),
)
MEMORY_REPLICATED_ARRAY_BYTES = Family(
    "jaxmon_memory_replicated_array_bytes",
    GAUGE,
    (
        "Bytes of live jax.Array shards in the device's memory that belong to arrays fully replicated over more than "
        "one device, in the workload process: what a sharded layout would save."
    ),
    (*_DEVICE, "workload"),
    "`jax.live_arrays()`: `sharding.is_fully_replicated` over more than one device",
    _MEMORY,
    extra=(_OWNERS,),
)
MEMORY_HOST_ARRAY_BYTES = Family(
    "jaxmon_memory_host_array_bytes",
    GAUGE,
    (
        "Bytes of live jax.Array shards in a host memory kind (pinned_host, unpinned_host) attached to the device in "
        "the workload process: offloaded state that memory_stats() does not see."
    ),
    (*_DEVICE, "memory_kind", "workload"),
    "`jax.live_arrays()`: `sharding.memory_kind` `pinned_host`, `unpinned_host`",
    _MEMORY,
    extra=(_OWNERS,),
)

# probe

DEVICE_UP = Family(
    "jaxmon_device_up",
    GAUGE,
    (
        "1 when the device answered its last probe within the timeout, 0 when it failed or timed out; 1 while the "
        "job in this process trains on it (its steps complete; no probe runs then). CPU devices share the host's "
        "cores and one probe: each carries the probed CPU device's answer."
    ),
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
DEVICE_UTILIZATION_RATIO = Family(
    "jaxmon_device_utilization_ratio",
    GAUGE,
    (
        "ESTIMATED share of the device busy with other work, from probe slowdown: 1 - probe_baseline_seconds / "
        "probe_duration_seconds, clamped to [0, 1] (CPU devices: the probed CPU device's estimate of the host's "
        "cores). Absent while the device is down, and while the job in this process trains on it (no probe runs "
        "then)."
    ),
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_DURATION_SECONDS = Family(
    "jaxmon_probe_duration_seconds",
    GAUGE,
    "Latency of the last completed probe timing (the median of its shots).",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_BASELINE_SECONDS = Family(
    "jaxmon_probe_baseline_seconds",
    GAUGE,
    (
        "Idle probe latency: the median of recent timings a device-wide source saw idle (CPU devices: the host's CPU "
        "time), or without one the lower of the start-up calibration and the median of recent timings."
    ),
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_FLOPS_PER_SECOND = Family(
    "jaxmon_probe_flops_per_second",
    GAUGE,
    "FLOP/s the last probe run achieved (compiled cost analysis x steps / latency).",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_MEMORY_BYTES = Family(
    "jaxmon_probe_memory_bytes",
    GAUGE,
    "Device memory the compiled probe uses (arguments + output + temporaries), allocated once.",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_STEPS = Family(
    "jaxmon_probe_steps",
    GAUGE,
    "Matmul steps per probe run, chosen by calibration.",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_RUNS = Family(
    "jaxmon_probe_runs",
    COUNTER,
    "Probe runs started.",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_FAILURES = Family(
    "jaxmon_probe_failures",
    COUNTER,
    "Probe runs that raised an error.",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_TIMEOUTS = Family(
    "jaxmon_probe_timeouts",
    COUNTER,
    "Probe runs that did not finish within the timeout.",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_SKIPPED = Family(
    "jaxmon_probe_skipped",
    COUNTER,
    "Scheduled probe runs skipped because the previous run was still in flight (a hung device).",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_DEFERRED = Family(
    "jaxmon_probe_deferred",
    COUNTER,
    (
        "Scheduled probe runs not dispatched because the job in this process was training on the device (a step of "
        "it ended within the probe interval): jaxmon runs no program beside the job's. Meanwhile the device is up "
        "and has no utilization estimate."
    ),
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_BUSY_SECONDS = Family(
    "jaxmon_probe_busy_seconds",
    COUNTER,
    "Seconds of probe runs on the device; its rate() is the probe's duty cycle.",
    _DEVICE,
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)
PROBE_BASELINE_INFO = Family(
    "jaxmon_probe_baseline_info",
    GAUGE,
    (
        "Where the probe's baseline comes from, always 1: calibrated (now, device idle), restored "
        "(--collector.probe.baseline-file), provisional (taken while a device-wide source said the device was busy; "
        "no utilization estimate until an idle recalibration)."
    ),
    (*_DEVICE, "origin"),
    "probe",
    _PROBE,
    extra=(_PROBE_WORKLOAD, _OWNERS),
)

# compile

JIT_COMPILATIONS = Family(
    "jaxmon_jit_compilations",
    COUNTER,
    "XLA backend compilations in the workload (persistent-cache loads too).",
    ("workload", "process_index"),
    "`jax.monitoring` `/jax/core/compile/backend_compile_duration`",
    _COMPILE,
    zeros=Zeros(),
)
JIT_COMPILE_SECONDS = Family(
    "jaxmon_jit_compile_seconds",
    COUNTER,
    "Seconds spent in XLA backend compilation in the workload.",
    ("workload", "process_index"),
    "same event's duration",
    _COMPILE,
    zeros=Zeros(),
)
COMPILATION_CACHE_HITS = Family(
    "jaxmon_compilation_cache_hits",
    COUNTER,
    "Compilations in the workload that the persistent compilation cache answered (JAX's cache_hits).",
    ("workload", "process_index"),
    "`/jax/compilation_cache/cache_hits`",
    _COMPILE,
    zeros=Zeros(),
)
COMPILATION_CACHE_MISSES = Family(
    "jaxmon_compilation_cache_misses",
    COUNTER,
    (
        "Compilations in the workload that looked in the persistent compilation cache and found nothing (JAX's "
        "compile_requests_use_cache - cache_hits), whether or not the result was then written "
        "(jax_persistent_cache_min_compile_time_secs, ..._min_entry_size_bytes)."
    ),
    ("workload", "process_index"),
    "`/jax/compilation_cache/compile_requests_use_cache` − `cache_hits`",
    _COMPILE,
    zeros=Zeros(),
)

# training

TRAINING_STEPS = Family(
    "jaxmon_training_steps",
    COUNTER,
    "Training steps completed (jaxmon.step() calls seen through).",
    _PROCESS,
    "`jaxmon.step()`",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros(),
)
TRAINING_STEP = Family(
    "jaxmon_training_step",
    GAUGE,
    "The number of the last step jaxmon.step() reported and saw complete.",
    _PROCESS,
    "`jaxmon.step(n)`",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_DISPATCHED_STEP = Family(
    "jaxmon_training_dispatched_step",
    GAUGE,
    (
        "The number of the last step handed to jaxmon.step(), complete or not: in a synchronous job, a process whose "
        "number is behind the others' is the one they wait for."
    ),
    _PROCESS,
    "`jaxmon.step(n)`",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_LAST_STEP_TIMESTAMP_SECONDS = Family(
    "jaxmon_training_last_step_timestamp_seconds",
    GAUGE,
    "Unix time the last step completed (as jaxmon's waiter saw it), read from the wall clock at that moment.",
    _PROCESS,
    "waiter thread",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_LOSS = Family(
    "jaxmon_training_loss",
    GAUGE,
    (
        "The loss the training loop handed to jaxmon.step() (a scalar array: name loss; a dict of scalar arrays: "
        "each key, the first 16 sorted), read on jaxmon's thread from a looked-at step at most every 0.5 s while the "
        "loop steps and once when it goes still, as it is: NaN and +Inf are exported as read (a diverged loss is the "
        "news). Of the step "
        "jaxmon_training_loss_step names; absent until a loss was read."
    ),
    (*_PROCESS, "name"),
    "`step(n, loss)`, waiter thread",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_LOSS_STEP = Family(
    "jaxmon_training_loss_step",
    GAUGE,
    "The number of the step jaxmon_training_loss's values are of (absent until a loss was read).",
    _PROCESS,
    "same",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_STEP_DURATION_SECONDS = Family(
    "jaxmon_training_step_duration_seconds",
    HISTOGRAM,
    (
        "Completion to completion of consecutive training steps (what a step costs the job, host time included); the "
        "same buckets in every process, so histograms sum across a job."
    ),
    _PROCESS,
    "waiter thread",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros(),
    buckets=_DURATION_BUCKETS,
)
TRAINING_EXAMPLES = Family(
    "jaxmon_training_examples",
    COUNTER,
    (
        "This process's share of the examples the job's steps processed: step(examples=...) (the job's global batch) "
        "/ the job's process count, so that sum() over the job is the job's total."
    ),
    _PROCESS,
    "`step(examples=)`",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros(),
)
TRAINING_TOKENS = Family(
    "jaxmon_training_tokens",
    COUNTER,
    (
        "This process's share of the tokens the job's steps processed: step(tokens=...) (the job's) / the job's "
        "process count, so that sum() over the job is the job's total."
    ),
    _PROCESS,
    "`step(tokens=)`",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros(),
)
TRAINING_MODEL_FLOPS = Family(
    "jaxmon_training_model_flops",
    COUNTER,
    "Model FLOPs of the steps on this device: step(model_flops=...) (the whole job's) / jax.device_count().",
    _PROCESS_DEVICE,
    "`step(model_flops=)`",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_HARDWARE_FLOPS = Family(
    "jaxmon_training_hardware_flops",
    COUNTER,
    (
        "FLOPs XLA counts for the tracked functions' programs on this device (cost analysis per compiled program, "
        "per device after SPMD; remat and replicated work included, a scan body counted once)."
    ),
    _PROCESS_DEVICE,
    "`jaxmon.track()`, `compile().cost_analysis()`",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_HARDWARE_ACCESSED_BYTES = Family(
    "jaxmon_training_hardware_accessed_bytes",
    COUNTER,
    "Bytes XLA counts as accessed by the tracked functions' programs on this device (cost analysis).",
    _PROCESS_DEVICE,
    "same",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
DEVICE_PEAK_FLOPS_PER_SECOND = Family(
    "jaxmon_device_peak_flops_per_second",
    GAUGE,
    (
        "Dense bf16 peak FLOP/s of the device (label origin: table, by device kind; or setting: "
        "collector.training.peak_flops)."
    ),
    (*_PROCESS_DEVICE, "origin"),
    "peak table",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_MODEL_FLOPS_UTILIZATION_RATIO = Family(
    "jaxmon_training_model_flops_utilization_ratio",
    GAUGE,
    "MFU over the last window of steps: model FLOPs on this device / (the steps' duration x the device's peak).",
    _PROCESS_DEVICE,
    "derived",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_HARDWARE_FLOPS_UTILIZATION_RATIO = Family(
    "jaxmon_training_hardware_flops_utilization_ratio",
    GAUGE,
    "HFU over the last window of steps: XLA's FLOPs on this device / (the steps' duration x the device's peak).",
    _PROCESS_DEVICE,
    "derived",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_HOST_WAIT_SECONDS = Family(
    "jaxmon_training_host_wait_seconds",
    COUNTER,
    (
        "Time the devices waited for the host: how much later a step was handed to jaxmon.step() than the previous "
        "one completed (the host-bound signal)."
    ),
    _PROCESS,
    "waiter thread",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros(),
)
TRAINING_START_TIME_SECONDS = Family(
    "jaxmon_training_start_time_seconds",
    GAUGE,
    (
        "Unix time the workload's jaxmon started (start() or publish()): the productive seconds and every kind of "
        "badput add up to jaxmon_training_last_step_timestamp_seconds minus it, unless the wall clock was stepped "
        "between the two (they are counted on the monotonic clock)."
    ),
    _PROCESS,
    "tracker",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_PRODUCTIVE_SECONDS = Family(
    "jaxmon_training_productive_seconds",
    COUNTER,
    (
        "Time the devices computed steps, less stalls: the part of each step's interval after the host handed the "
        "step to jaxmon.step() (goodput = its increase over the increase of it plus every kind of badput)."
    ),
    _PROCESS,
    "derived",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros(),
)
TRAINING_BADPUT_SECONDS = Family(
    "jaxmon_training_badput_seconds",
    COUNTER,
    (
        "Time that was not training, by kind: startup (to the first completed step, less other kinds); inside the "
        "devices' idle time (from a step's completion until the next was handed to jaxmon.step()): compile, "
        "checkpoint (Orbax saves), restore (Orbax restores), the user's badput() kinds (data, eval, ...; other past "
        "the 10th), and host (the idle time nothing names); restart (around a step number that went back); stall (a "
        "step's busy time over stall_factor x the window median)."
    ),
    (*_PROCESS, "kind"),
    "`badput()`, `jax.monitoring`",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    # the built-in kinds (jaxmon.training.accounting, handed.EVENT_KINDS); a process adds its declared ones
    zeros=Zeros("kind", ("startup", "compile", "checkpoint", "restore", "host", "restart", "stall")),
)
TRAINING_TRACKING_PROBLEMS = Family(
    "jaxmon_training_tracking_problems",
    COUNTER,
    (
        "What the training tracker could not use, by reason: back and jump (step numbers that do not follow), "
        "unready (a ready array deleted or donated first), invalid (a figure given to step() that is not a finite "
        "number >= 0, or a step number that is not an integer: dropped for that step), unread (a figure or step "
        "number array deleted or donated before it was read), dropped (too many steps pending), cost (no cost "
        "analysis), badput_kinds (a badput() block of a kind past the 10th, counted as other), intervals (closed "
        "badput intervals past 10 000 since the last completed step, dropped), programs (a tracked function's "
        "program whose cost was forgotten past 256 programs), communication (a program's HLO or memory analysis "
        "failed, or too many waited for it: that program adds no collective bytes nor peak memory), link_<why> "
        "(collectives whose link is not known: docs/placement.md), trace_ambiguous and trace_unnamed (sampled-trace "
        'events of an analysed collective instruction counted under link="unknown": analysed programs of the event\'s'
        " module name disagree on its place, or the trace does not say which program the event is of), error (a bug "
        "of the waiter's)."
    ),
    (*_PROCESS, "reason"),
    "tracker",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros("reason", _PROBLEM_REASONS),
)
TRAINING_COLLECTIVE_BYTES = Family(
    "jaxmon_training_collective_bytes",
    COUNTER,
    (
        "Bytes the collectives of the tracked functions' programs moved on this device, by op (all-reduce, "
        "all-gather, reduce-scatter, all-to-all, collective-permute, ...) and the user's mesh axes their groups span "
        "(axes, comma-joined; empty without a mesh) and the slowest link their groups cross (link: local, nvlink, "
        "ici, pcie, sys, dcn, network, unknown): per call, from the compiled HLO (nccl-tests' convention: "
        "all-reduce, all-to-all, collective-permute the buffer, all-gather the gathered output, reduce-scatter the "
        "input; a loop body's collectives times its trip count); the calls made before jaxmon's thread has analysed "
        "the program are added once it has."
    ),
    (*_DEVICE, "op", "axes", "link", "workload", "process_index", "host"),
    "`jaxmon.track()`, the compiled HLO (`compile().as_text()`), off the training thread",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROGRAM_PEAK_MEMORY_BYTES = Family(
    "jaxmon_training_program_peak_memory_bytes",
    GAUGE,
    (
        "The largest peak device memory XLA predicts (compile().memory_analysis()) for the tracked functions' "
        "programs the last window of steps called on this device: compare with jaxmon_memory_limit_bytes."
    ),
    _PROCESS_DEVICE,
    "`jaxmon.track()`, `compile().memory_analysis()`, off the training thread",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
LINK_NOMINAL_BANDWIDTH_BYTES_PER_SECOND = Family(
    "jaxmon_link_nominal_bandwidth_bytes_per_second",
    GAUGE,
    (
        "Nominal bandwidth per direction of each link of this device's kind (nvlink, pcie, ici, dcn), from the "
        "vendor's figure (bidirectional ones halved, as nccl-tests compares bus bandwidth with one direction; "
        "sources in jaxmon/catalog/hardware.py): what the achieved bus bandwidth is compared with. None for a kind "
        "not in the table."
    ),
    (*_DEVICE, "link", "workload", "process_index", "host"),
    "nominal link table (vendor figures)",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILES = Family(
    "jaxmon_training_profiles",
    COUNTER,
    (
        "Sampled traces by result: taken, busy (the user was profiling: jaxmon took none, or ended its own when the "
        "user's trace started; or jaxmon's trace before held the profiler until the block's steps had run), failed (no "
        "step of the block was traced whole, or the trace could not be read), skipped (the block's steps held named "
        "badput: an eval, a checkpoint, a compilation; tried again on the next clean steps)."
    ),
    (*_PROCESS, "result"),
    "sampled traces",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
    zeros=Zeros("result", ("taken", "busy", "failed", "skipped")),  # where sampling is on,
)
TRAINING_PROFILED_SECONDS = Family(
    "jaxmon_training_profiled_seconds",
    COUNTER,
    (
        "Time of the steps the sampled traces held on this device (collector.training.profile: every `every` steps, "
        "`steps` whole steps, each the tracker's completion-to-completion interval): the sum of "
        "jaxmon_training_profile_seconds_total's parts."
    ),
    _PROCESS_DEVICE,
    "sampled traces (`jax.profiler`), the tracker's step intervals",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILE_SECONDS = Family(
    "jaxmon_training_profile_seconds",
    COUNTER,
    (
        "Where the sampled steps' time went on this device, by part (the union of the device's op intervals, in this "
        "order of precedence): compute (any op not a collective or a copy running), collective (a collective "
        "running and no compute: exposed communication), copy (only host-device or device-device transfers), idle "
        "(nothing)."
    ),
    (*_PROCESS_DEVICE, "part"),
    "sampled traces: union of the device's op intervals",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
    zeros=Zeros("part", ("compute", "collective", "copy", "idle")),  # each sampled device's,
)
TRAINING_PROFILE_COLLECTIVE_SECONDS = Family(
    "jaxmon_training_profile_collective_seconds",
    COUNTER,
    (
        "Time a collective of this kind (op: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, "
        "...), mesh axes and link (jaxmon_training_collective_bytes_total's) ran on this device in the sampled "
        "steps, overlapped with compute or not (the union of each instruction's intervals, summed; an event of an "
        "instruction jaxmon did not analyse: axes empty, link unknown)."
    ),
    (*_PROCESS_DEVICE, "op", "axes", "link"),
    "sampled traces: union of each collective instruction's intervals, by its place (compiled HLO)",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILE_EXPOSED_COLLECTIVE_SECONDS = Family(
    "jaxmon_training_profile_exposed_collective_seconds",
    COUNTER,
    (
        "Time collectives of this op, mesh axes and link ran on this device in the sampled steps with no compute "
        "running (exposed: what the step waited on them; collectives running at once each count it)."
    ),
    (*_PROCESS_DEVICE, "op", "axes", "link"),
    "sampled traces: each collective's time with no compute running",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILE_COLLECTIVE_BYTES = Family(
    "jaxmon_training_profile_collective_bytes",
    COUNTER,
    (
        "Bytes of the collectives of this op, mesh axes and link inside the sampled steps on this device: each "
        "traced event times its instruction's bytes per execution (the compiled HLO, nccl-tests' convention); "
        "rate(bytes) / rate(jaxmon_training_profile_collective_seconds_total) is the achieved bus bandwidth."
    ),
    (*_PROCESS_DEVICE, "op", "axes", "link"),
    "sampled traces' events x the compiled HLO's bytes per execution",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILE_COPY_SECONDS = Family(
    "jaxmon_training_profile_copy_seconds",
    COUNTER,
    (
        "The copy part of jaxmon_training_profile_seconds_total (copies running and nothing else) on this device in "
        "the sampled steps, by direction: host_to_device, device_to_host, device_to_device (a GPU's MemcpyD2D and "
        "MemcpyP2P: the cross-device copy of an operation on arrays of two devices), other (a copy whose direction "
        "the trace does not say: a TPU's copy-start/copy-done); copies running at once each count it."
    ),
    (*_PROCESS_DEVICE, "direction"),
    "sampled traces: the copy part by each copy event's direction",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILE_COPY_BYTES = Family(
    "jaxmon_training_profile_copy_bytes",
    COUNTER,
    (
        "Bytes of the copies of this direction that started inside the sampled steps on this device, where the trace "
        "says them (a GPU's memcpy events' size); none where it does not (CPU devices, TPUs)."
    ),
    (*_PROCESS_DEVICE, "direction"),
    "sampled traces: GPU memcpy events' sizes",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)
TRAINING_PROFILE_SAMPLE_STEP = Family(
    "jaxmon_training_profile_sample_step",
    GAUGE,
    (
        "The first step number of the last sampled trace taken, the steps jaxmon_training_collective_wait_ratio is "
        "of: every process of a job traces the same step numbers (absent before the first sample)."
    ),
    _PROCESS,
    "sampled traces: the block's first step (`collector.training.profile.every`)",
    _TRAINING,
    extra=(_PROCESS_COUNT,),
)
TRAINING_COLLECTIVE_WAIT_RATIO = Family(
    "jaxmon_training_collective_wait_ratio",
    GAUGE,
    (
        "The share of the last sampled trace's steps this device spent waiting in collectives (its collective part: "
        "a collective running and no compute, over the steps' time); jaxmon_training_profile_sample_step says which "
        "steps. In a synchronous job the device the others wait for waits least (JaxmonTrainingComputeStraggler)."
    ),
    _PROCESS_DEVICE,
    "the last sampled trace: the device's collective part over the steps' time",
    _TRAINING,
    extra=(_PROCESS_COUNT, _OWNERS),
)


# checkpoint

_ORBAX_SAVES = "Orbax's save events (`jax.monitoring`), `jaxmon.checkpointed()`"
TRAINING_LAST_CHECKPOINT_STEP = Family(
    "jaxmon_training_last_checkpoint_step",
    GAUGE,
    (
        "The step whose state the process's last checkpoint holds: the number last handed to jaxmon.step() when an "
        "Orbax save that completed started, or jaxmon.checkpointed(step). jaxmon_training_step minus it is the steps "
        "a crash now would compute again."
    ),
    _PROCESS,
    _ORBAX_SAVES,
    _CHECKPOINT,
    extra=(_PROCESS_COUNT,),
)
TRAINING_LAST_CHECKPOINT_TIMESTAMP_SECONDS = Family(
    "jaxmon_training_last_checkpoint_timestamp_seconds",
    GAUGE,
    (
        "Unix time the state of the process's last checkpoint was taken (an Orbax save's start; "
        "jaxmon.checkpointed()'s time): what a restore brings back. time() minus it is what a crash now would lose."
    ),
    _PROCESS,
    _ORBAX_SAVES,
    _CHECKPOINT,
    extra=(_PROCESS_COUNT,),
)
TRAINING_CHECKPOINT_INTERVAL_SECONDS = Family(
    "jaxmon_training_checkpoint_interval_seconds",
    GAUGE,
    "How often the job said it checkpoints (collector.checkpoint.interval); absent when it did not say.",
    _PROCESS,
    "`collector.checkpoint.interval`",
    _CHECKPOINT,
    extra=(_PROCESS_COUNT,),
)
TRAINING_CHECKPOINT_INTERVAL_STEPS = Family(
    "jaxmon_training_checkpoint_interval_steps",
    GAUGE,
    (
        "Every how many steps the job said it checkpoints (collector.checkpoint.interval_steps); absent when it did "
        "not say."
    ),
    _PROCESS,
    "`collector.checkpoint.interval_steps`",
    _CHECKPOINT,
    extra=(_PROCESS_COUNT,),
)

# spool

WORKLOAD_LAST_REPORT_TIMESTAMP_SECONDS = Family(
    "jaxmon_workload_last_report_timestamp_seconds",
    GAUGE,
    "Unix time the workload process last wrote its spool file (the file's mtime on the sidecar's clock).",
    ("workload", "process_index"),
    "spool",
    _SPOOL,
)
SPOOL_REJECTED_FILES = Family(
    "jaxmon_spool_rejected_files",
    COUNTER,
    "Spool files skipped because they are not what a publisher writes.",
    ("reason",),
    "spool",
    _SPOOL,
)
SPOOL_OVERFLOW_FILES = Family(
    "jaxmon_spool_overflow_files",
    COUNTER,
    (
        "Live spool files left unread in a poll: past --collector.spool.max-workloads, or past "
        "--collector.spool.max-reads-per-poll (read at a later poll); counted every poll they are left out."
    ),
    ("reason",),
    "spool",
    _SPOOL,
)
SPOOL_REMOVED_FILES = Family(
    "jaxmon_spool_removed_files",
    COUNTER,
    "Stale publisher files (json) and crashed writers' temporary files (tmp) the sidecar removed.",
    ("kind",),
    "spool",
    _SPOOL,
)
SPOOL_STALE_FILES = Family(
    "jaxmon_spool_stale_files",
    GAUGE,
    (
        "Files in the spool directory past --collector.spool.ttl and not (yet) removed, orphaned temporary files "
        "included."
    ),
    (),
    "spool",
    _SPOOL,
)

# nvml

DEVICE_SOURCE_UP = Family(
    "jaxmon_device_source_up",
    GAUGE,
    "1 when the device-wide source (label source) answered for this device in its last poll, 0 when it failed.",
    _DEVICE_WIDE,
    "NVML; libtpu `tpu.runtime.hbm.memory.{total,usage}.bytes`",
    _DEVICE_WIDE_SOURCES,
    extra=(_OWNERS,),
)
DEVICE_MEMORY_TOTAL_BYTES = Family(
    "jaxmon_device_memory_total_bytes",
    GAUGE,
    "Device memory in total, as the device-wide source reports it.",
    _DEVICE_WIDE,
    "NVML memory info; libtpu `tpu.runtime.hbm.memory.total.bytes`",
    _DEVICE_WIDE_SOURCES,
    extra=(_OWNERS,),
)
DEVICE_MEMORY_USED_BYTES = Family(
    "jaxmon_device_memory_used_bytes",
    GAUGE,
    "Device memory in use by all processes (device-wide, not one allocator's bytes_in_use).",
    _DEVICE_WIDE,
    "NVML memory info (v2, else v1); libtpu `tpu.runtime.hbm.memory.usage.bytes`",
    _DEVICE_WIDE_SOURCES,
    extra=(_OWNERS,),
)
DEVICE_DUTY_CYCLE_RATIO = Family(
    "jaxmon_device_duty_cycle_ratio",
    GAUGE,
    "Share of the source's last sample period in which the device ran any kernel (0-1); device-wide.",
    _DEVICE_WIDE,
    "NVML `utilization.gpu` / 100; libtpu `tpu.runtime.tensorcore.dutycycle.percent` / 100",
    _DEVICE_WIDE_SOURCES,
    extra=(_OWNERS,),
)
DEVICE_MEMORY_BANDWIDTH_UTILIZATION_RATIO = Family(
    "jaxmon_device_memory_bandwidth_utilization_ratio",
    GAUGE,
    "Share of the last sample period in which device memory was read or written (0-1); device-wide.",
    _DEVICE_WIDE,
    "NVML `utilization.memory` / 100; libtpu `tpu.runtime.hbm.utilization.percent` / 100",
    _DEVICE_WIDE_SOURCES,
    extra=(_OWNERS,),
)
DEVICE_ENCODER_UTILIZATION_RATIO = Family(
    "jaxmon_device_encoder_utilization_ratio",
    GAUGE,
    "Share of the last sample period the video encoder (NVENC) was busy (NVML, 0-1).",
    _DEVICE_WIDE,
    "NVML encoder utilization / 100",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_DECODER_UTILIZATION_RATIO = Family(
    "jaxmon_device_decoder_utilization_ratio",
    GAUGE,
    "Share of the last sample period the video decoders (NVDEC) were busy (NVML, 0-1).",
    _DEVICE_WIDE,
    "NVML decoder utilization / 100",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_POWER_WATTS = Family(
    "jaxmon_device_power_watts",
    GAUGE,
    "Power draw of the device (NVML power usage).",
    _DEVICE_WIDE,
    "NVML power usage",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_POWER_LIMIT_WATTS = Family(
    "jaxmon_device_power_limit_watts",
    GAUGE,
    "Enforced power limit of the device (NVML).",
    _DEVICE_WIDE,
    "NVML enforced power limit",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_POWER_MANAGEMENT_LIMIT_WATTS = Family(
    "jaxmon_device_power_management_limit_watts",
    GAUGE,
    (
        "Power management limit set on the device (NVML; the enforced limit is the lowest of this and the board's "
        "other constraints)."
    ),
    _DEVICE_WIDE,
    "NVML power management limit",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_ENERGY_JOULES = Family(
    "jaxmon_device_energy_joules",
    COUNTER,
    "Energy the device consumed since the driver loaded (NVML total energy consumption).",
    _DEVICE_WIDE,
    "NVML total energy consumption (mJ) / 1000",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_TEMPERATURE_CELSIUS = Family(
    "jaxmon_device_temperature_celsius",
    GAUGE,
    "GPU core temperature (NVML).",
    _DEVICE_WIDE,
    "NVML temperature (GPU sensor)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_GRAPHICS_CLOCK_HERTZ = Family(
    "jaxmon_device_graphics_clock_hertz",
    GAUGE,
    "Current graphics clock (NVML).",
    _DEVICE_WIDE,
    "NVML clock info (graphics)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_SM_CLOCK_HERTZ = Family(
    "jaxmon_device_sm_clock_hertz",
    GAUGE,
    "Current SM clock (NVML).",
    _DEVICE_WIDE,
    "NVML clock info (SM)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_MEMORY_CLOCK_HERTZ = Family(
    "jaxmon_device_memory_clock_hertz",
    GAUGE,
    "Current memory clock (NVML).",
    _DEVICE_WIDE,
    "NVML clock info (memory)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_VIDEO_CLOCK_HERTZ = Family(
    "jaxmon_device_video_clock_hertz",
    GAUGE,
    "Current video clock (NVML).",
    _DEVICE_WIDE,
    "NVML clock info (video)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_GRAPHICS_CLOCK_MAX_HERTZ = Family(
    "jaxmon_device_graphics_clock_max_hertz",
    GAUGE,
    "Highest graphics clock of the device (NVML).",
    _DEVICE_WIDE,
    "NVML max clock info (graphics)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_SM_CLOCK_MAX_HERTZ = Family(
    "jaxmon_device_sm_clock_max_hertz",
    GAUGE,
    "Highest SM clock of the device (NVML).",
    _DEVICE_WIDE,
    "NVML max clock info (SM)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_MEMORY_CLOCK_MAX_HERTZ = Family(
    "jaxmon_device_memory_clock_max_hertz",
    GAUGE,
    "Highest memory clock of the device (NVML).",
    _DEVICE_WIDE,
    "NVML max clock info (memory)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_VIDEO_CLOCK_MAX_HERTZ = Family(
    "jaxmon_device_video_clock_max_hertz",
    GAUGE,
    "Highest video clock of the device (NVML).",
    _DEVICE_WIDE,
    "NVML max clock info (video)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_PCIE_REPLAYS = Family(
    "jaxmon_device_pcie_replays",
    COUNTER,
    "PCIe packets the link had to resend (NVML PCIe replay counter); a rising count is a failing link.",
    _DEVICE_WIDE,
    "NVML PCIe replay counter",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_THROTTLED = Family(
    "jaxmon_device_throttled",
    GAUGE,
    "1 when NVML reports this clocks event (throttle) reason as active, else 0; one series per known reason.",
    (*_DEVICE_WIDE, "reason"),
    "NVML clocks event reasons",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_ECC_ERRORS = Family(
    "jaxmon_device_ecc_errors",
    COUNTER,
    "Volatile ECC errors (since the driver loaded) by kind; absent where ECC is off or unsupported.",
    (*_DEVICE_WIDE, "kind"),
    "NVML total ECC errors",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_FAN_SPEED_RATIO = Family(
    "jaxmon_device_fan_speed_ratio",
    GAUGE,
    "Each fan's intended speed as a share of its maximum (NVML; above 1 where driven past it); absent without fans.",
    (*_DEVICE_WIDE, "fan"),
    (
        'NVML fan speed per fan (`nvmlDeviceGetNumFans`, `_FanSpeed_v2`; one fan, `fan="0"`, through '
        "`nvmlDeviceGetFanSpeed` on older drivers) / 100"
    ),
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_PCIE_THROUGHPUT_BYTES_PER_SECOND = Family(
    "jaxmon_device_pcie_throughput_bytes_per_second",
    GAUGE,
    "PCIe traffic of the device by direction (tx: sent by the GPU, rx: received), over NVML's 20 ms sample.",
    (*_DEVICE_WIDE, "direction"),
    "NVML PCIe throughput (KB/s, taken as KiB) × 1024",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_REMAPPED_ROWS = Family(
    "jaxmon_device_remapped_rows",
    COUNTER,
    (
        "Memory rows the row remapper replaced with spares, by the kind of error that caused it (NVML; Ampere and "
        "newer)."
    ),
    (*_DEVICE_WIDE, "kind"),
    "NVML remapped rows",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_ROW_REMAPPING_PENDING = Family(
    "jaxmon_device_row_remapping_pending",
    GAUGE,
    "1 while a row remapping waits for a GPU reset to take effect (NVML), else 0.",
    _DEVICE_WIDE,
    "NVML remapped rows (pending)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_ROW_REMAPPING_FAILED = Family(
    "jaxmon_device_row_remapping_failed",
    GAUGE,
    "1 when a row remapping failed (no spare row left: the GPU needs replacing; NVML), else 0.",
    _DEVICE_WIDE,
    "NVML remapped rows (failure occurred)",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_NVLINK_ACTIVE = Family(
    "jaxmon_device_nvlink_active",
    GAUGE,
    "1 when this NVLink is active, 0 when it is down (NVML).",
    (*_DEVICE_WIDE, "link"),
    "NVML NVLink state",
    _NVML,
    extra=(_OWNERS,),
)
# Traffic and errors are one series per GPU by default, summed over its links (no `link` label); with
# --collector.nvml.nvlink-links, one per link instead (a `link` label). A daemon exports one shape or the other, never
# both, so `sum by (device, ...)` over either gives the GPU's total and the name cannot double count.
DEVICE_NVLINK_DATA_BYTES = Family(
    "jaxmon_device_nvlink_data_bytes",
    COUNTER,
    (
        "Payload bytes over the GPU's NVLinks by direction since the driver loaded (NVML NVLink throughput "
        "counters), summed over its links (a link down counts with its last reading); per link (a link label, active "
        "links only) with --collector.nvml.nvlink-links."
    ),
    (*_DEVICE_WIDE, "direction"),
    "NVML field values `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX` (KiB) × 1024, scope = link",
    _NVML,
    extra=(_LINKS, _OWNERS),
)
DEVICE_NVLINK_ERRORS = Family(
    "jaxmon_device_nvlink_errors",
    COUNTER,
    (
        "NVLink data-link errors by kind (replay, recovery, crc_flit, crc_data) since the driver loaded (NVML), "
        "summed over the GPU's links (a link down counts with its last reading); per link (a link label, active "
        "links only) with --collector.nvml.nvlink-links."
    ),
    (*_DEVICE_WIDE, "kind"),
    "NVML NVLink error counters",
    _NVML,
    extra=(_LINKS, _OWNERS),
)
DEVICE_MIG_ENABLED = Family(
    "jaxmon_device_mig_enabled",
    GAUGE,
    "1 when the GPU runs in MIG mode, 0 when not; absent without MIG.",
    _DEVICE_WIDE,
    "NVML MIG mode (current)",
    _NVML,
    extra=(_OWNERS,),
)
MIG_DEVICE_INFO = Family(
    "jaxmon_mig_device_info",
    GAUGE,
    (
        "Each MIG device of a GPU in MIG mode, by its UUID (what pods and CUDA_VISIBLE_DEVICES name), GPU and "
        "compute instance and profile; always 1."
    ),
    (*_DEVICE_WIDE, "mig_uuid", "gpu_instance", "compute_instance", "profile", "name"),
    "NVML MIG device handles, UUID, GPU and compute instance ids, name",
    _NVML,
    extra=(_OWNERS,),
)
MIG_DEVICE_MEMORY_TOTAL_BYTES = Family(
    "jaxmon_mig_device_memory_total_bytes",
    GAUGE,
    "Device memory of the MIG device in total (NVML).",
    (*_DEVICE_WIDE, "mig_uuid", "gpu_instance", "compute_instance", "profile"),
    "NVML memory info of the MIG device",
    _NVML,
    extra=(_OWNERS,),
)
MIG_DEVICE_MEMORY_USED_BYTES = Family(
    "jaxmon_mig_device_memory_used_bytes",
    GAUGE,
    "Device memory in use on the MIG device (NVML).",
    (*_DEVICE_WIDE, "mig_uuid", "gpu_instance", "compute_instance", "profile"),
    "same",
    _NVML,
    extra=(_OWNERS,),
)
MIG_DEVICE_DUTY_CYCLE_RATIO = Family(
    "jaxmon_mig_device_duty_cycle_ratio",
    GAUGE,
    (
        "Share of the last sample period the MIG device ran any kernel (NVML, 0-1); absent where the driver does not "
        "report it for MIG devices."
    ),
    (*_DEVICE_WIDE, "mig_uuid", "gpu_instance", "compute_instance", "profile"),
    "NVML utilization of the MIG device / 100",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_GPM_SUPPORTED = Family(
    "jaxmon_device_gpm_supported",
    GAUGE,
    (
        "1 when NVML serves GPM profiling metrics for the GPU (Hopper and newer), 0 when not (no GPM series for it "
        "then; the log says why); absent with --collector.nvml.gpm false."
    ),
    _DEVICE_WIDE,
    "NVML `nvmlGpmQueryDeviceSupport`",
    _NVML,
    extra=(_OWNERS,),
)
DEVICE_GRAPHICS_ENGINE_ACTIVE_RATIO = Family(
    "jaxmon_device_graphics_engine_active_ratio",
    GAUGE,
    (
        "Share of time the graphics/compute engine was active, averaged over the interval between the last two GPM "
        "samples (one poll interval) (NVML GPM GRAPHICS_UTIL / 100; DCGM_FI_PROF_GR_ENGINE_ACTIVE, "
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO from dcgm-exporter 4.9)."
    ),
    _DEVICE_WIDE,
    "NVML GPM `GRAPHICS_UTIL` / 100",
    _NVML,
    extra=(_MIG, _OWNERS),
)
DEVICE_SM_ACTIVE_RATIO = Family(
    "jaxmon_device_sm_active_ratio",
    GAUGE,
    (
        "Share of the SMs that were busy (at least one warp resident), averaged over the interval between the last "
        "two GPM samples (one poll interval) (NVML GPM SM_UTIL / 100; dcgm-exporter's DCGM_FI_PROF_SM_ACTIVE, "
        "DCGM_FI_PROF_SM_UTIL_RATIO from 4.9)."
    ),
    _DEVICE_WIDE,
    "NVML GPM `SM_UTIL` / 100",
    _NVML,
    extra=(_MIG, _OWNERS),
)
DEVICE_SM_OCCUPANCY_RATIO = Family(
    "jaxmon_device_sm_occupancy_ratio",
    GAUGE,
    (
        "Resident warps as a share of the SMs' theoretical maximum, averaged over the interval between the last two "
        "GPM samples (one poll interval) (NVML GPM SM_OCCUPANCY / 100; DCGM_FI_PROF_SM_OCCUPANCY, "
        "DCGM_FI_PROF_SM_OCCUPANCY_RATIO from dcgm-exporter 4.9)."
    ),
    _DEVICE_WIDE,
    "NVML GPM `SM_OCCUPANCY` / 100",
    _NVML,
    extra=(_MIG, _OWNERS),
)
DEVICE_TENSOR_ACTIVE_RATIO = Family(
    "jaxmon_device_tensor_active_ratio",
    GAUGE,
    (
        "Share of cycles any tensor pipe was active, averaged over the interval between the last two GPM samples "
        "(one poll interval) (NVML GPM ANY_TENSOR_UTIL / 100; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, "
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO from dcgm-exporter 4.9)."
    ),
    _DEVICE_WIDE,
    "NVML GPM `ANY_TENSOR_UTIL` / 100",
    _NVML,
    extra=(_MIG, _OWNERS),
)
DEVICE_DRAM_ACTIVE_RATIO = Family(
    "jaxmon_device_dram_active_ratio",
    GAUGE,
    (
        "Device memory bandwidth used as a share of its peak, averaged over the interval between the last two GPM "
        "samples (one poll interval) (NVML GPM DRAM_BW_UTIL / 100; DCGM_FI_PROF_DRAM_ACTIVE, "
        "DCGM_FI_PROF_DRAM_UTIL_RATIO from dcgm-exporter 4.9)."
    ),
    _DEVICE_WIDE,
    "NVML GPM `DRAM_BW_UTIL` / 100",
    _NVML,
    extra=(_MIG, _OWNERS),
)
DEVICE_PIPE_ACTIVE_RATIO = Family(
    "jaxmon_device_pipe_active_ratio",
    GAUGE,
    (
        "Share of cycles each SM pipe was active, averaged over the interval between the last two GPM samples (one "
        "poll interval), by pipe: fp64, fp32, fp16 (non-tensor math), tensor_hmma, tensor_imma, tensor_dfma, integer "
        "(NVML GPM *_UTIL / 100; DCGM_FI_PROF_PIPE_*_ACTIVE, DCGM_FI_PROF_*_UTIL_RATIO from dcgm-exporter 4.9: "
        "docs/dcgm.md); with --collector.nvml.gpm-pipes."
    ),
    (*_DEVICE_WIDE, "pipe"),
    (
        "NVML GPM `FP64_UTIL` (11), `FP32_UTIL` (12), `FP16_UTIL` (13), `HMMA_TENSOR_UTIL` (7), `IMMA_TENSOR_UTIL` "
        "(9), `DFMA_TENSOR_UTIL` (6), `INTEGER_UTIL` (4) / 100"
    ),
    _NVML,
    extra=(_MIG, _OWNERS),
)
DEVICE_XID_ERRORS = Family(
    "jaxmon_device_xid_errors",
    COUNTER,
    "Critical Xid events NVML delivered since jaxmon started, by xid (see the runbook for 48 and 79).",
    (*_DEVICE_WIDE, "xid"),
    "NVML event set",
    _NVML,
    extra=(_OWNERS,),
)
PROCESS_DEVICE_MEMORY_BYTES = Family(
    "jaxmon_process_device_memory_bytes",
    GAUGE,
    (
        "Device memory used by each running compute process (NVML; pid in NVML's PID namespace), the "
        "--collector.nvml.max-processes largest per GPU. workload is set where a workload report has that pid, which "
        "needs a shared PID namespace."
    ),
    (*_DEVICE_WIDE, "pid"),
    "NVML running compute processes",
    _NVML,
    extra=(_PID_WORKLOAD, _OWNERS),
)
PROCESS_DEVICE_MEMORY_OTHER_BYTES = Family(
    "jaxmon_process_device_memory_other_bytes",
    GAUGE,
    (
        "Device memory used by the compute processes of the GPU beyond the --collector.nvml.max-processes largest "
        "(NVML; 0 when every process has its own series)."
    ),
    _DEVICE_WIDE,
    "NVML running compute processes",
    _NVML,
    extra=(_OWNERS,),
)
PROCESS_DEVICE_MEMORY_OTHER_PROCESSES = Family(
    "jaxmon_process_device_memory_other_processes",
    GAUGE,
    (
        "Compute processes of the GPU beyond the --collector.nvml.max-processes largest, whose memory is "
        "jaxmon_process_device_memory_other_bytes (NVML)."
    ),
    _DEVICE_WIDE,
    "NVML running compute processes",
    _NVML,
    extra=(_OWNERS,),
)
PROCESS_SM_UTILIZATION_RATIO = Family(
    "jaxmon_process_sm_utilization_ratio",
    GAUGE,
    (
        "Share of the GPU's SM (3D/compute) time the process used over NVML's samples of it since the previous poll "
        "(the mean; 0 for a running process NVML did not sample: idle), 0-1; pid in NVML's PID namespace. The "
        "--collector.nvml.max-processes busiest (by SM) per GPU; none on MIG-enabled GPUs."
    ),
    (*_DEVICE_WIDE, "pid"),
    "NVML per-process utilization `smUtil` / 100, mean of the samples since the last poll",
    _NVML,
    extra=(_PID_WORKLOAD, _OWNERS),
)
PROCESS_MEMORY_BANDWIDTH_UTILIZATION_RATIO = Family(
    "jaxmon_process_memory_bandwidth_utilization_ratio",
    GAUGE,
    (
        "Share of the GPU's memory (frame buffer) bandwidth time the process used over NVML's samples of it since "
        "the previous poll (the mean; 0 for a running process NVML did not sample: idle), 0-1; pid in NVML's PID "
        "namespace. The --collector.nvml.max-processes busiest (by SM) per GPU; none on MIG-enabled GPUs."
    ),
    (*_DEVICE_WIDE, "pid"),
    "NVML per-process utilization `memUtil` / 100, same",
    _NVML,
    extra=(_PID_WORKLOAD, _OWNERS),
)
PROCESS_ENCODER_UTILIZATION_RATIO = Family(
    "jaxmon_process_encoder_utilization_ratio",
    GAUGE,
    (
        "Share of the GPU's video encoder (NVENC) time the process used over NVML's samples of it since the previous "
        "poll (the mean; 0 for a running process NVML did not sample: idle), 0-1; pid in NVML's PID namespace. The "
        "--collector.nvml.max-processes busiest (by SM) per GPU; none on MIG-enabled GPUs."
    ),
    (*_DEVICE_WIDE, "pid"),
    "NVML per-process utilization `encUtil` / 100, same",
    _NVML,
    extra=(_PID_WORKLOAD, _OWNERS),
)
PROCESS_DECODER_UTILIZATION_RATIO = Family(
    "jaxmon_process_decoder_utilization_ratio",
    GAUGE,
    (
        "Share of the GPU's video decoder (NVDEC) time the process used over NVML's samples of it since the previous "
        "poll (the mean; 0 for a running process NVML did not sample: idle), 0-1; pid in NVML's PID namespace. The "
        "--collector.nvml.max-processes busiest (by SM) per GPU; none on MIG-enabled GPUs."
    ),
    (*_DEVICE_WIDE, "pid"),
    "NVML per-process utilization `decUtil` / 100, same",
    _NVML,
    extra=(_PID_WORKLOAD, _OWNERS),
)

# tpu

DEVICE_TENSORCORE_IDLE_DURATION_SECONDS = Family(
    "jaxmon_device_tensorcore_idle_duration_seconds",
    GAUGE,
    (
        "TensorCore idle duration of the device as libtpu reports it (tpu.runtime.tensorcore.idle_duration.seconds; "
        "tpu-info's TensorCore Idle Duration)."
    ),
    _DEVICE_WIDE,
    "libtpu `tpu.runtime.tensorcore.idle_duration.seconds`",
    _TPU,
    extra=(_OWNERS,),
)
DEVICE_HLO_QUEUE_SIZE = Family(
    "jaxmon_device_hlo_queue_size",
    GAUGE,
    "HLO programs queued for execution on the device (libtpu).",
    _DEVICE_WIDE,
    "libtpu `hlo.queue.size.gauge`",
    _TPU,
    extra=(_OWNERS,),
)
DEVICE_HLO_EXECUTION_SECONDS = Family(
    "jaxmon_device_hlo_execution_seconds",
    GAUGE,
    (
        "HLO program execution time on the device at a percentile (label percentile: 50, 90, 95, 99.9), from "
        "libtpu's distribution."
    ),
    (*_DEVICE_WIDE, "percentile"),
    "libtpu `hlo.execution.timing.distribution.microseconds` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
DEVICE_HLO_EXECUTION_MEAN_SECONDS = Family(
    "jaxmon_device_hlo_execution_mean_seconds",
    GAUGE,
    "Mean HLO program execution time (libtpu).",
    _DEVICE_WIDE,
    "same distribution's mean / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_DCN_TRANSFER_LATENCY_SECONDS = Family(
    "jaxmon_megascale_dcn_transfer_latency_seconds",
    SUMMARY,
    (
        "Latency of buffer transfers over the data-center network (DCN) between the slices of a multi-slice job "
        "(tpu-info's Buffer Transfer Latency). By buffer size (label buffer_size), the host's entries of each size "
        "summed as tpu-info sums them. From libtpu's cumulative distribution on this host: quantiles 0.5, 0.9, 0.95 "
        "and 0.999 since libtpu started (tpu-info's p50 to p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source", "buffer_size"),
    "libtpu `megascale.dcn_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_DCN_INBOUND_TRANSFER_LATENCY_SECONDS = Family(
    "jaxmon_megascale_dcn_inbound_transfer_latency_seconds",
    SUMMARY,
    (
        "Latency of inbound buffer transfers over DCN from other slices (tpu-info's Inbound Buffer Transfer "
        "Latency). By buffer size (label buffer_size), the host's entries of each size summed as tpu-info sums them. "
        "From libtpu's cumulative distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu "
        "started (tpu-info's p50 to p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source", "buffer_size"),
    "libtpu `megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_HOST_TO_DEVICE_TRANSFER_LATENCY_SECONDS = Family(
    "jaxmon_megascale_host_to_device_transfer_latency_seconds",
    SUMMARY,
    (
        "Latency of the host-to-device transfers of multi-slice traffic (tpu-info's Host to Device Transfer "
        "Latency). By buffer size (label buffer_size), the host's entries of each size summed as tpu-info sums them. "
        "From libtpu's cumulative distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu "
        "started (tpu-info's p50 to p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source", "buffer_size"),
    "libtpu `megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_DEVICE_TO_HOST_TRANSFER_LATENCY_SECONDS = Family(
    "jaxmon_megascale_device_to_host_transfer_latency_seconds",
    SUMMARY,
    (
        "Latency of the device-to-host transfers of multi-slice traffic (tpu-info's Device to Host Transfer "
        "Latency). By buffer size (label buffer_size), the host's entries of each size summed as tpu-info sums them. "
        "From libtpu's cumulative distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu "
        "started (tpu-info's p50 to p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source", "buffer_size"),
    "libtpu `megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_COLLECTIVE_END_TO_END_LATENCY_SECONDS = Family(
    "jaxmon_megascale_collective_end_to_end_latency_seconds",
    SUMMARY,
    (
        "End-to-end latency of collectives across slices (tpu-info's Collective End to End Latency). By buffer size "
        "(label buffer_size), the host's entries of each size summed as tpu-info sums them. From libtpu's cumulative "
        "distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu started (tpu-info's p50 to "
        "p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source", "buffer_size"),
    "libtpu `megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_HOST_COMPUTE_LATENCY_SECONDS = Family(
    "jaxmon_megascale_host_compute_latency_seconds",
    SUMMARY,
    (
        "Latency of the host's compute in multi-slice collectives (libtpu's mxla_compute_latencies; tpu-info's Host "
        "Compute Latency). By buffer size (label buffer_size), the host's entries of each size summed as tpu-info "
        "sums them. From libtpu's cumulative distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since "
        "libtpu started (tpu-info's p50 to p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source", "buffer_size"),
    "libtpu `megascale.mxla_compute_latencies.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_GRPC_TCP_MIN_RTT_SECONDS = Family(
    "jaxmon_megascale_grpc_tcp_min_rtt_seconds",
    SUMMARY,
    (
        "Minimum TCP round-trip time of the host's multi-slice gRPC connections, all connections summed into one "
        "distribution (tpu-info's gRPC TCP Minimum RTT). From libtpu's cumulative distribution on this host: "
        "quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu started (tpu-info's p50 to p999); rate(_sum) / rate(_count) "
        "is the recent mean."
    ),
    ("source",),
    "libtpu `megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution` / 10⁶",
    _TPU,
    extra=(_OWNERS,),
)
MEGASCALE_GRPC_TCP_DELIVERY_RATE_BYTES_PER_SECOND = Family(
    "jaxmon_megascale_grpc_tcp_delivery_rate_bytes_per_second",
    SUMMARY,
    (
        "TCP delivery rate of the host's multi-slice gRPC connections in bytes per second (libtpu's Mbps x 125000), "
        "all connections summed into one distribution (tpu-info's gRPC TCP Delivery Rate). From libtpu's cumulative "
        "distribution on this host: quantiles 0.5, 0.9, 0.95 and 0.999 since libtpu started (tpu-info's p50 to "
        "p999); rate(_sum) / rate(_count) is the recent mean."
    ),
    ("source",),
    "libtpu `megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution` × 125 000 (Mbps to bytes/s)",
    _TPU,
    extra=(_OWNERS,),
)

# tpu (libtpu's monitoring SDK)

DEVICE_TENSORCORE_UTILIZATION_RATIO = Family(
    "jaxmon_device_tensorcore_utilization_ratio",
    GAUGE,
    (
        "Utilization of one TensorCore of the chip (label core: its index in libtpu's list), from libtpu's "
        "monitoring SDK (tensorcore_util; tpu-info's TensorCore Utilization), 0-1: the TPU ladder's rung between the "
        "duty cycle and MFU."
    ),
    (*_DEVICE_WIDE, "core"),
    'libtpu SDK `tpumonitoring.get_metric("tensorcore_util").data()` / 100, read in the daemon\'s child process',
    _TPU_SDK,
    extra=(_OWNERS,),
)
LIBTPU_SDK_STATUS = Family(
    "jaxmon_libtpu_sdk_status",
    GAUGE,
    (
        "1 on the current status of the daemon's reading of libtpu's monitoring SDK (its child process), 0 on the "
        "others: ok, empty (the SDK answered no values), starting (libtpu is being imported), not_installed, "
        "import_failed, failed (the SDK raised), crashed (the child died), timeout (no answer within "
        "--collector.tpu.sdk-timeout), spawn_failed (the child could not be started: fork's EAGAIN at a pids limit, "
        "no temporary directory)."
    ),
    ("source", "status"),
    "the daemon's SDK child: its import, its answers, its deadline",
    _TPU_SDK,
    extra=(Extra(_OWNERS.labels, "the node's TPU holder, as on every series of the host's libtpu"),),
)
LIBTPU_SDK_CHILD_STARTS = Family(
    "jaxmon_libtpu_sdk_child_starts",
    COUNTER,
    "Child processes started to read libtpu's monitoring SDK (one, unless children crashed or hung).",
    ("source",),
    "the daemon's SDK child processes started",
    _TPU_SDK,
    extra=(Extra(_OWNERS.labels, "the node's TPU holder, as on every series of the host's libtpu"),),
)
LIBTPU_SDK_CHILD_SPAWN_FAILURES = Family(
    "jaxmon_libtpu_sdk_child_spawn_failures",
    COUNTER,
    (
        "Starts of the SDK's child process that failed (fork's EAGAIN at a pids limit, no temporary directory), each "
        "tried again after a back-off; the tpu collector's gRPC series are not affected."
    ),
    ("source",),
    "the daemon's SDK child processes that could not start",
    _TPU_SDK,
    extra=(Extra(_OWNERS.labels, "the node's TPU holder, as on every series of the host's libtpu"),),
)

# kubernetes

KUBERNETES_POD_DEVICE_INFO = Family(
    "jaxmon_kubernetes_pod_device_info",
    GAUGE,
    (
        "1 for each GPU, MIG device or TPU chip the kubelet assigned to a container (device_id as the device plugin "
        "names it; for a DRA claim's device, resource is the driver, device_id pool/device, and claim the claim); "
        "absent while the kubelet does not answer, after the ttl."
    ),
    ("namespace", "pod", "container", "resource", "device_id"),
    "kubelet pod-resources `List` (`devices`, `dynamic_resources`)",
    _KUBERNETES,
    extra=(Extra(("claim",), "a DRA claim's device"),),
)
KUBERNETES_API_UP = Family(
    "jaxmon_kubernetes_api_up",
    GAUGE,
    (
        "1 when the last list of the node's resourceslices or pods from the API server succeeded, 0 when it failed "
        "(the last good answer stays in use)."
    ),
    ("list",),
    "API server `GET` of the node's resourceslices, pods",
    _KUBERNETES,
)
KUBERNETES_API_FAILURES = Family(
    "jaxmon_kubernetes_api_failures",
    COUNTER,
    (
        "Lists of the node's resourceslices or pods from the API server that failed, by reason: config, unreachable, "
        "timeout, tls, unauthorized, forbidden, http_<status>, bad_answer."
    ),
    ("list", "reason"),
    "API server `GET` of the node's resourceslices, pods",
    _KUBERNETES,
)
KUBERNETES_API_LAST_SUCCESS_TIMESTAMP_SECONDS = Family(
    "jaxmon_kubernetes_api_last_success_timestamp_seconds",
    GAUGE,
    "Unix time of the last successful list of the node's resourceslices or pods from the API server.",
    ("list",),
    "API server `GET` of the node's resourceslices, pods",
    _KUBERNETES,
)
KUBERNETES_DRA_PROBLEMS = Family(
    "jaxmon_kubernetes_dra_problems",
    COUNTER,
    (
        "DRA-claimed GPUs and TPU chips without an identity, each counted once when found: not_in_slices (no "
        "ResourceSlice of the node names its driver, pool and device), no_identity (named without a uuid or index). "
        "Their holders label no series."
    ),
    ("reason",),
    "kubelet `dynamic_resources` against the node's ResourceSlices",
    _KUBERNETES,
)
KUBERNETES_PROCESS_PROBLEMS = Family(
    "jaxmon_kubernetes_process_problems",
    COUNTER,
    (
        "Processes on the GPUs whose owner cannot be named, each counted once: pod_not_listed (its cgroup names a "
        "pod UID that a pods list of this node taken after the process was found does not list, e.g. a static pod). "
        "Their per-process series carry no pod."
    ),
    ("reason",),
    "NVML compute processes' `/proc/<pid>/cgroup` against the API server's pods on the node",
    _KUBERNETES,
)

# slurm

SLURM_JOB_DEVICE_INFO = Family(
    "jaxmon_slurm_job_device_info",
    GAUGE,
    (
        "1 for each GPU a Slurm job's processes use (NVML's compute processes, whose cgroup names the job); join on "
        "uuid: ... * on(uuid) group_left(job_id) jaxmon_slurm_job_device_info."
    ),
    ("job_id", "uid", "device", "uuid"),
    "NVML compute processes' `/proc/<pid>/cgroup` (Slurm's job cgroups)",
    _SLURM,
)


FAMILIES: tuple[Family, ...] = tuple(v for v in tuple(globals().values()) if isinstance(v, Family))
BY_NAME: Mapping[str, Family] = {f.name: f for f in FAMILIES}


def undeclared(name: str, kind: str, samples: Iterable[tuple[str, Iterable[str]]]) -> list[str]:
    """What a rendered family of `name` and type `kind` with `samples` ((sample name, its label names)) does that the
    catalog does not declare: an unknown family, another type, a sample name or a label it lacks ([] when none)."""
    family = BY_NAME.get(name)
    if family is None:
        return [f"{name}: not in the catalog (jaxmon/catalog/metrics.py)"]
    if kind != family.type:
        return [f"{name}: rendered as a {kind}, declared a {family.type}"]
    allowed = family.label_names.union(TYPE_LABELS.get(kind, ()))
    names = {name + suffix for suffix in SUFFIXES[kind]}
    problems: set[str] = set()
    for sample, labels in samples:
        if sample not in names:
            problems.add(f"{name}: a sample named {sample}")
        given = set(labels)
        if given - allowed:
            problems.add(f"{name}: label(s) {sorted(given - allowed)} not declared")
        if set(family.labels) - given:
            problems.add(f"{name}: a series without {sorted(set(family.labels) - given)}")
    return sorted(problems)
