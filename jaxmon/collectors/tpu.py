"""The `tpu` collector: device-wide HBM, duty cycle, idle duration and HLO queue and timing of each chip, and the
host's megascale (multi-slice DCN and gRPC TCP) distributions, from libtpu's runtime metrics service.

It reads what tpu-info reads (gRPC to the training process's libtpu, default `localhost:8431`), so it works in a
sidecar whose own JAX runs on CPU beside a job that holds every chip: it never opens `/dev/accel*` or `/dev/vfio`.
A metric this libtpu does not list is never asked for; one it does not serve (not listed, or a megascale one it
refuses outside a multi-slice job) has absent series, logged once; one it lists but fails to answer is absent that
poll, logged once while it fails, and makes the poll partial (`jaxmon_collector_success 0`) without taking the other
series with it.

Every series of a chip carries `chip_labels(device)`, and every series of the host `host_labels()`: the one place
their labels come from. They name the chip (or the host's service) only; who owns it is the owner transform's
(jaxmon.ownership.owners), by the identities the state offers (`TpuState.identities`).

Device labels: `device` is libtpu's `device-id`. Where this process's own JAX sees TPU devices, their ids are
compared with libtpu's; jaxmon cannot verify on its own that the two numberings name the same chip (libtpu's
service carries no chip identity to join on), so a mismatch is logged once and libtpu's id is kept, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

import structlog
from prometheus_client.core import Metric
from pydantic import Field, field_validator

from jaxmon.catalog.metrics import DEVICE_DUTY_CYCLE_RATIO as DEVICE_DUTY_CYCLE
from jaxmon.catalog.metrics import DEVICE_HLO_EXECUTION_MEAN_SECONDS as HLO_EXECUTION_MEAN
from jaxmon.catalog.metrics import DEVICE_HLO_EXECUTION_SECONDS as HLO_EXECUTION
from jaxmon.catalog.metrics import DEVICE_HLO_QUEUE_SIZE as HLO_QUEUE
from jaxmon.catalog.metrics import DEVICE_MEMORY_BANDWIDTH_UTILIZATION_RATIO as DEVICE_MEMORY_BANDWIDTH
from jaxmon.catalog.metrics import DEVICE_MEMORY_TOTAL_BYTES as DEVICE_MEMORY_TOTAL
from jaxmon.catalog.metrics import DEVICE_MEMORY_USED_BYTES as DEVICE_MEMORY_USED
from jaxmon.catalog.metrics import DEVICE_SOURCE_UP
from jaxmon.catalog.metrics import DEVICE_TENSORCORE_IDLE_DURATION_SECONDS as IDLE_DURATION
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Offers, Update
from jaxmon.exchange import DEVICE_IDENTITIES, DUTY_CYCLES, TPU_DEVICE, TPU_NODE, DeviceId, SeriesKey
from jaxmon.families import add
from jaxmon.families.libtpu import MEGASCALE, sdk_families, summary_family
from jaxmon.logsetup import ErrorLog
from jaxmon.settings import CollectorOptions, Duration, Enabled
from jaxmon.snapshot import Snapshot
from jaxmon.sources import libtpu
from jaxmon.sources.libtpu import sdk, sdk_state

log = structlog.get_logger("jaxmon.collectors.tpu")

_HOST_PORT = re.compile(r"^(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})$")
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:")

SOURCE = "libtpu"
# Any TPU chip of this node: what the chips' holders are known by (jaxmon.ownership.attribution).
NODE_CHIPS: DeviceId = (TPU_NODE, "")

# A service that stays down is logged once, then reminded of hourly (not per poll): nothing listening is normal
# before training starts and after it ends.
_REMIND_SECONDS = 3600.0


class TpuOptions(CollectorOptions):
    """`--collector.tpu.*`."""

    enabled: Enabled = Field(
        default="auto",
        description="true, false, or auto (on where this host has TPU chips or JAX sees TPU devices, or where "
        "collector.tpu.address is given).",
    )
    address: str = Field(default="localhost:8431", description="host:port of libtpu's runtime metrics service.")
    timeout: Duration = Field(default=2.0, description="Deadline of one poll of the service (all calls together).")
    sdk: bool = Field(
        default=True,
        description="Also read libtpu's monitoring SDK (TensorCore utilization) in a child process of the daemon. "
        "Never in a training process: the embedded exporter leaves it off.",
    )
    sdk_timeout: Duration = Field(
        default=2.0, description="Deadline of one read of libtpu's monitoring SDK by its child process."
    )

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        # gRPC takes a port past 65535 modulo 2^16 and an empty target as dns:///: refuse both here, by name.
        if value.startswith(_GRPC_SCHEMES):
            return value
        match = _HOST_PORT.match(value)
        if not match or not 1 <= int(match.group("port")) <= 65535:
            raise ValueError(
                f"expected host:port or [ipv6]:port with a port in 1-65535 (or a gRPC target URI), got {value!r}"
            )
        return value


@dataclass(frozen=True)
class TpuDevice:
    """One libtpu device-id: up when it answered this poll's memory metrics; its values where served."""

    id: int
    up: bool
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    duty_cycle_ratio: float | None = None
    bandwidth_utilization_ratio: float | None = None
    idle_duration_seconds: float | None = None
    hlo_queue_size: float | None = None
    hlo_timing: libtpu.Timing | None = None


@dataclass(frozen=True)
class TpuState:
    """The devices libtpu reported since the service last came up (empty while it is down), and the host's
    megascale distributions it answered this poll (metric name -> one per buffer size where it has them)."""

    devices: tuple[TpuDevice, ...] = ()
    host: Mapping[str, tuple[libtpu.Summary, ...]] = field(default_factory=dict)
    error: str | None = None
    # True when this process's JAX sees TPU devices with exactly libtpu's ids (embedded in a trainer, or a daemon
    # that owns the chips): only then are a JAX device and a libtpu device-id taken to be the same chip.
    same_ids_as_jax: bool = False
    # libtpu's monitoring SDK, read by a child process (None where it is not read: embedded, or sdk off).
    sdk: sdk_state.SdkState | None = None

    @property
    def identities(self) -> dict[SeriesKey, tuple[DeviceId, ...]]:
        """Which chip each series is about (DEVICE_IDENTITIES): a chip's by libtpu's device-id and as one of the
        node's chips; the host's (the megascale distributions) as the service of the node's chips."""
        out: dict[SeriesKey, tuple[DeviceId, ...]] = {(SOURCE, "", ""): (NODE_CHIPS,)}
        for dev in self.devices:
            out[(SOURCE, "tpu", str(dev.id))] = ((TPU_DEVICE, str(dev.id)), NODE_CHIPS)
        return out

    def duty_cycle(self, platform: str, device: int) -> float | None:
        """The duty cycle of JAX device `platform:device` (devicewide.DutyCycles), None unless ids match."""
        if platform != "tpu" or not self.same_ids_as_jax:
            return None
        for dev in self.devices:
            if dev.id == device:
                return dev.duty_cycle_ratio
        return None


@register
class TpuCollector(Collector[TpuOptions, TpuState]):
    """Polls libtpu's runtime metrics service over one long-lived gRPC channel."""

    name = "tpu"
    description = (
        "Device-wide TPU memory, duty cycle, idle duration and HLO queue, and multi-slice DCN latencies, from "
        "libtpu's runtime metrics (as tpu-info)."
    )
    options = TpuOptions
    order = 60
    offers: ClassVar[Offers] = {DUTY_CYCLES: lambda state: state, DEVICE_IDENTITIES: lambda state: state.identities}

    def __init__(self, opts: TpuOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self._client: libtpu.LibtpuClient | None = None
        self._errors = ErrorLog(log, _REMIND_SECONDS)
        # Device-ids seen since the service came up: one missing from a later answer is reported down.
        self._known: set[int] = set()
        self._mapping_checked = False
        # The optional metrics last logged as not served here (logged again only when the set changes).
        self._unserved: frozenset[str] = frozenset()
        # The SDK's child (never inside a training process: importing libtpu there has crashed jobs).
        self._sdk = sdk.SdkChild(opts.sdk_timeout) if opts.sdk and ctx.in_process is None else None
        self._sdk_status = ""

    @classmethod
    def unavailable(cls, opts: TpuOptions, ctx: Context) -> str | None:
        """Without tpu-info nothing can be read; on `auto`, also off where the host has no TPU chip.

        An explicit `--collector.tpu` runs wherever tpu-info imports: the service may be reachable from a host (or a
        container) that shows no chip of its own, and the address says where it is. So does `auto` with an address
        given (`--collector.tpu.address`, its variable or YAML): a user who names a service's address meant it.
        """
        # Found, not imported: importing grpc costs about 13 MiB of RSS (BENCHMARKS.md), too much to pay on a node
        # without TPUs (the node mode's budget); a client made later imports it.
        import importlib.util

        if importlib.util.find_spec("grpc") is None:
            return "tpu-info is not installed (no module named 'grpc')"
        try:
            from tpu_info import device  # reads /sys only; imports no grpc
        except ImportError as exc:
            return f"tpu-info is not installed ({exc})"
        if opts.enabled is True or "address" in opts.model_fields_set:
            return None
        if ctx.source.name == "local" and any(d.platform == "tpu" for d in ctx.devices):
            return None  # this process's JAX has chips (recorded devices of a replay file are no chips)
        try:
            # Reads /sys/bus/pci/devices/*/{vendor,device,subsystem_device} only (tpu_info/device.py).
            _chip, count = device.get_local_chips()
        except (OSError, AssertionError) as exc:
            return f"cannot list TPU chips in /sys/bus/pci: {exc}"
        if count == 0:
            return "no TPU chip on this host (no Google PCI device in /sys/bus/pci/devices)"
        return None

    def update(self) -> Update[TpuState]:
        client = self._client
        if client is None:
            client = self._client = libtpu.LibtpuClient(
                self.opts.address, self.opts.timeout, max_reconnect_backoff=min(self.interval, 5.0)
            )
        try:
            reading = client.poll()
        except libtpu.LibtpuUnavailable as exc:
            self._errors.error(
                "service", "libtpu runtime metrics unavailable", exc.code, address=self.opts.address, detail=exc.detail
            )
            self._known.clear()
            return Update(TpuState(error=str(exc), sdk=self._read_sdk()), success=False)
        self._errors.ok("service", "libtpu runtime metrics answer", address=self.opts.address)
        self._log_metrics(reading)
        st = self._state(reading)
        return Update(replace(st, sdk=self._read_sdk()), success=not reading.failed)

    def _read_sdk(self) -> sdk_state.SdkState | None:
        """The SDK's reading this poll (its own status; it never makes the poll partial), logged when it changes."""
        if self._sdk is None:
            return None
        try:
            reading = self._sdk.read((sdk.TENSORCORE_UTIL, *sdk.PER_CHIP))
        except Exception as exc:  # the SDK's series alone: never the gRPC service's (read() is not meant to raise)
            reading = sdk.SdkReading("failed", f"reading the SDK child raised {type(exc).__name__}: {exc}")
        st = sdk_state.state(reading, self._sdk.starts, sorted(self._known), self._sdk.spawn_failures)
        if st.status != self._sdk_status:
            self._sdk_status = st.status
            level = log.info if st.status in ("ok", "starting", "empty", "not_installed") else log.warning
            level("libtpu monitoring SDK status", status=st.status, detail=st.detail, version=reading.version)
        return st

    def _log_metrics(self, reading: libtpu.LibtpuReading) -> None:
        """One line per change: metrics not served here, each failing metric, each metric jaxmon cannot read."""
        if reading.unserved != self._unserved:
            self._unserved = reading.unserved
            if reading.unserved:
                log.info(
                    "libtpu does not serve these metrics here; their series are absent",
                    metrics=sorted(reading.unserved),
                    address=self.opts.address,
                )
        for name in libtpu.OPTIONAL:
            if name in reading.failed:
                self._errors.error(
                    f"metric {name}",
                    "libtpu metric failed; its series are absent",
                    reading.failed[name],
                    metric=name,
                    address=self.opts.address,
                )
            elif name not in reading.unserved:
                self._errors.ok(f"metric {name}", "libtpu metric answers again", metric=name)
            if name in reading.unreadable:
                self._errors.error(
                    f"shape {name}",
                    "libtpu answered a metric in a shape jaxmon does not read; its series are absent",
                    "unreadable",
                    metric=name,
                )
            else:
                self._errors.ok(f"shape {name}", "libtpu metric readable again", metric=name)

    def _state(self, reading: libtpu.LibtpuReading) -> TpuState:
        g = reading.gauges
        total, used = g.get(libtpu.TOTAL, {}), g.get(libtpu.USAGE, {})
        present = set(total) & set(used)
        self._known |= present
        same_ids = self._check_mapping(present)
        devices = []
        for dev in sorted(self._known):
            if dev not in present:
                self._errors.error(f"device {dev}", "libtpu did not report a device", "missing", device=dev)
                devices.append(TpuDevice(dev, up=False))
                continue
            self._errors.ok(f"device {dev}", "libtpu reports the device again", device=dev)
            devices.append(
                TpuDevice(
                    dev,
                    up=True,
                    memory_total_bytes=total[dev],
                    memory_used_bytes=used[dev],
                    duty_cycle_ratio=_ratio(g.get(libtpu.DUTY_CYCLE, {}).get(dev)),
                    bandwidth_utilization_ratio=_ratio(g.get(libtpu.HBM_UTILIZATION, {}).get(dev)),
                    idle_duration_seconds=g.get(libtpu.IDLE_DURATION, {}).get(dev),
                    hlo_queue_size=g.get(libtpu.HLO_QUEUE, {}).get(dev),
                    hlo_timing=reading.timings.get(dev),
                )
            )
        return TpuState(devices=tuple(devices), host=dict(reading.host), same_ids_as_jax=same_ids)

    def _check_mapping(self, libtpu_ids: set[int]) -> bool:
        """Whether this process's JAX TPU ids are libtpu's; logs once when they differ (labels stay libtpu's)."""
        jax_ids = {d.id for d in self.ctx.devices if d.platform == "tpu"}
        if not jax_ids or not libtpu_ids:
            return False
        same = libtpu_ids == jax_ids
        if self._mapping_checked:
            return same
        self._mapping_checked = True
        if not same:
            log.warning(
                "libtpu device ids differ from this process's JAX TPU ids; labelling by libtpu's device-id",
                libtpu_ids=sorted(libtpu_ids),
                jax_ids=sorted(jax_ids),
            )
        return same

    def families(self, snap: Snapshot, state: TpuState) -> Iterator[Metric]:
        up = DEVICE_SOURCE_UP.new()
        total = DEVICE_MEMORY_TOTAL.new()
        used = DEVICE_MEMORY_USED.new()
        duty = DEVICE_DUTY_CYCLE.new()
        bandwidth = DEVICE_MEMORY_BANDWIDTH.new()
        idle, queue, timing, mean = IDLE_DURATION.new(), HLO_QUEUE.new(), HLO_EXECUTION.new(), HLO_EXECUTION_MEAN.new()
        for dev in state.devices:
            labels = chip_labels(dev.id)
            add(up, labels, 1.0 if dev.up else 0.0)
            for fam, value in (
                (total, dev.memory_total_bytes),
                (used, dev.memory_used_bytes),
                (duty, dev.duty_cycle_ratio),
                (bandwidth, dev.bandwidth_utilization_ratio),
                (idle, dev.idle_duration_seconds),
                (queue, dev.hlo_queue_size),
            ):
                if value is not None:
                    add(fam, labels, value)
            if dev.hlo_timing is not None:
                add(mean, labels, dev.hlo_timing.mean_seconds)
                # `percentile`, not `quantile`: that label belongs to summaries (promtool check metrics), and libtpu's
                # distribution gives no count and sum that are known to be counters.
                for q, seconds in dev.hlo_timing.quantiles:
                    add(timing, {**labels, "percentile": f"{q * 100:g}"}, seconds)
        yield from (up, total, used, duty, bandwidth, idle, queue, timing, mean)
        host = host_labels()
        for spec in libtpu.MEGASCALE:
            yield summary_family(MEGASCALE[spec.name], ((host, s) for s in state.host.get(spec.name, ())))
        yield from sdk_families(state.sdk)

    def stop(self) -> None:
        if self._sdk is not None:
            self._sdk.close()
        if self._client is not None:
            self._client.close()
            self._client = None


def chip_labels(device: int) -> dict[str, str]:
    """The labels of every series of one libtpu device-id (its `device` is libtpu's id: see the module doc)."""
    return {"device": str(device), "platform": "tpu", "source": SOURCE}


def host_labels() -> dict[str, str]:
    """The labels of every series of the host's libtpu (the megascale distributions), before their own: the
    service belongs to the process holding the chips, whose owner the transform adds."""
    return {"source": SOURCE}


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0
