"""The `nvml` collector: device-wide truth about every GPU through NVML (all processes' memory, duty cycle, power,
energy, heat, fans, clocks, throttling, ECC, row remapping, PCIe, NVLink, MIG devices, Xid, and GPM's SM, tensor,
DRAM and pipe activity), with no JAX GPU backend and no device memory of its own.

Device label: JAX GPU devices expose no UUID or PCI bus id (XLA's xla/pjrt/gpu/se_gpu_topology_description.cc,
SetupDeviceDescription, gives them only `coords`, `device_vendor`, `slice_index`/`partition_index`,
`compute_capability`, `shared_memory_per_block_optin` and `core_count`), and CUDA's ordinals follow
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER. So an NVML GPU is matched to a JAX device of this daemon only where
that is certain (`match_devices`), and is otherwise labelled by its NVML index;
the `device_match` label of its metrics.DEVICE_INFO series (`source="nvml"`) says which.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, ClassVar

import pynvml
import structlog
from prometheus_client.core import Metric
from pydantic import BeforeValidator, Field

from jaxmon.catalog import metrics
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Offers, Update
from jaxmon.exchange import (
    DEVICE_IDENTITIES,
    DUTY_CYCLES,
    GPU_MINOR,
    GPU_PROCESSES,
    GPU_UUID,
    JAX_DEVICE,
    PCI_BUS_ID,
    WORKLOAD_PIDS,
    DeviceId,
    GpuProcesses,
    SeriesKey,
    device_id,
)
from jaxmon.families import add
from jaxmon.families.nvml import NvLinkTotals, gpu_families, process_utilization, sum_links
from jaxmon.logsetup import ErrorLog
from jaxmon.settings import CollectorOptions, Enabled, parse_duration
from jaxmon.settings.durations import bounded
from jaxmon.snapshot import Snapshot
from jaxmon.sources.nvml import GpuReading, MigDevice, NvLink, Nvml, NvmlUnavailable, describe, probe_library
from jaxmon.sources.nvml.match import DeviceMatch as DeviceMatch
from jaxmon.sources.nvml.match import match_devices as match_devices

log = structlog.get_logger("jaxmon.collectors.nvml")

SOURCE = "nvml"
# Seconds a poll waits for a GPU's reads unless --collector.nvml.timeout says otherwise (or the poll interval is short).
DEFAULT_TIMEOUT = 2.0
# Compute processes per GPU with a pid series unless --collector.nvml.max-processes says otherwise.
DEFAULT_MAX_PROCESSES = 16


class NvmlOptions(CollectorOptions):
    """`--collector.nvml.*`."""

    enabled: Enabled = Field(
        default="auto", description="true, false, or auto (on where libnvidia-ml.so.1 loads and NVML initialises)."
    )
    xid_wait: Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 10.0)] = Field(
        default=0.5, description="How long the Xid event thread waits per call (bounds how long stop takes)."
    )
    timeout: Annotated[float, BeforeValidator(parse_duration), bounded(0.0, 60.0)] | None = Field(
        default=None,
        description="How long a poll waits for each GPU's reads (a GPU not answered by then is down that poll, and "
        "its next read waits for the hung one); default 2s, or half the poll interval where that is shorter.",
    )
    nvlink_links: bool = Field(
        default=False,
        description="Export NVLink traffic and error counters per link (6 series per link: 108 per H200) instead of "
        "summed per GPU; each link's state is exported either way.",
    )
    max_processes: int = Field(
        default=DEFAULT_MAX_PROCESSES,
        ge=0,
        le=4096,
        description="Compute processes per GPU given their own (pid-labelled) memory series, largest first; the "
        f"rest are counted in {metrics.PROCESS_DEVICE_MEMORY_OTHER_BYTES.name} and _other_processes. The same bound "
        f"holds the per-process utilization series ({metrics.PROCESS_SM_UTILIZATION_RATIO.name} and siblings), "
        "busiest by SM first.",
    )
    gpm: Enabled = Field(
        default="auto",
        description="GPM profiling metrics (SM, tensor, DRAM and pipe activity; Hopper and newer): auto (on where "
        "NVML says a GPU supports them), true (the same, an unsupported GPU logged as a warning), or false (not "
        "asked: no GPM series).",
    )
    gpm_pipes: bool = Field(
        default=False,
        description=f"Also export each SM pipe's GPM activity ({metrics.DEVICE_PIPE_ACTIVE_RATIO.name}: fp64, fp32, "
        "fp16, tensor_hmma, tensor_imma, tensor_dfma, integer): 7 series per GPU, off by default as in "
        "dcgm-exporter's default field list.",
    )


@dataclass(frozen=True)
class NvmlState:
    """The latest NVML poll: one reading per GPU (with its UUID and, in MIG mode, its MIG devices' UUIDs: what the
    kubelet's pod resources name), and the Xid events counted since start."""

    gpus: tuple[GpuReading, ...] = ()
    xid: Mapping[tuple[int, int], int] = field(default_factory=dict)
    # Why NVML as a whole is unusable (no devices are listed then).
    error: str | None = None
    match: DeviceMatch = field(default_factory=DeviceMatch)
    # Each GPU's NVLink counters summed over its links, a link down counting with its last reading (by NVML index).
    nvlink_totals: Mapping[int, NvLinkTotals] = field(default_factory=dict)

    def duty_cycle(self, platform: str, device: int) -> float | None:
        """The duty cycle of this daemon's JAX device `device`, where an NVML GPU is matched to it (DutyCycles)."""
        if platform != "gpu":
            return None
        for gpu in self.gpus:
            if gpu.up and self.match.jax_ids.get(gpu.index) == device:
                return gpu.duty_cycle_ratio
        return None

    @cached_property
    def identities(self) -> dict[SeriesKey, tuple[DeviceId, ...]]:
        """Which GPU each series is about (DEVICE_IDENTITIES, the owner transform's): every GPU's own series by its
        UUID, minor number and PCI bus id, and the JAX device matched to it (`match`) by the same. A MIG device's
        series name their MIG device themselves (`mig_uuid`)."""
        out: dict[SeriesKey, tuple[DeviceId, ...]] = {}
        for gpu in self.gpus:
            ids = gpu_identities(gpu)
            if not ids:
                continue
            out[(SOURCE, "gpu", str(self.match.device(gpu.index)))] = ids
            if gpu.index in self.match.jax_ids:
                out[(JAX_DEVICE, "gpu", str(self.match.jax_ids[gpu.index]))] = ids
        return out

    def mig_uuids(self, index: int) -> tuple[str, ...]:
        """The UUIDs (`MIG-…`) of the MIG devices of NVML GPU `index` at the last poll; () when not in MIG mode."""
        for gpu in self.gpus:
            if gpu.index == index:
                return tuple(mig.uuid for mig in gpu.mig_devices or ())
        return ()

    def processes(self) -> tuple[GpuProcesses, ...]:
        """The pids of each answering GPU's compute processes at the last poll (GPU_PROCESSES), with its UUID."""
        return tuple(
            GpuProcesses(str(self.match.device(g.index)), g.uuid or "", tuple(p.pid for p in g.processes or ()))
            for g in self.gpus
            if g.up and g.processes
        )


@register
class NvmlCollector(Collector[NvmlOptions, NvmlState]):
    """Every GPU's device-wide readings through NVML."""

    name = "nvml"
    description = (
        "GPU device-wide memory, duty cycle, power, energy, temperature, fans, clocks, throttling, ECC, row "
        "remapping, PCIe, NVLink, MIG devices, Xid and GPM profiling metrics via NVML."
    )
    options = NvmlOptions
    order = 50
    offers: ClassVar[Offers] = {
        DUTY_CYCLES: lambda state: state,
        DEVICE_IDENTITIES: lambda state: state.identities,
        GPU_PROCESSES: lambda state: state.processes(),
    }

    def __init__(self, opts: NvmlOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self._nvml = Nvml(xid_wait_seconds=opts.xid_wait, timeout_seconds=self.timeout, gpm=opts.gpm)
        # A failure is logged when it starts or changes, then once a minute, and once more when it clears.
        self._errors = ErrorLog(log)
        # Each GPU's links' last readings while active (by UUID, else NVML index; then link), for the per-GPU sums.
        self._links: dict[str, dict[int, NvLink]] = {}

    @classmethod
    def unavailable(cls, opts: NvmlOptions, ctx: Context) -> str | None:
        """Why NVML cannot run here, or None."""
        return probe_library()

    @property
    def timeout(self) -> float:
        """Seconds a poll waits for the GPUs' reads: the option, else 2 s or half the poll interval if shorter (a
        poll must end well within /healthz's staleness limit, 3 poll intervals by default)."""
        return self.opts.timeout if self.opts.timeout is not None else min(DEFAULT_TIMEOUT, self.ctx.poll_interval / 2)

    def update(self) -> Update[NvmlState]:
        """Poll every GPU, each under the deadline (a failing or hung GPU is reported down; the others keep flowing)."""
        try:
            self._nvml.open()
        except NvmlUnavailable as err:
            self._errors.error("nvml", "NVML poll failed", str(err))
            return Update(NvmlState(error=str(err)), success=False)
        try:
            gpus = tuple(self._nvml.read_all())
        except pynvml.NVMLError as err:
            # Not even the GPU count: report no GPUs rather than keep the last readings as if they were fresh.
            error = f"NVML cannot count the GPUs: {describe(err)}"
            self._errors.error("nvml", "NVML poll failed", error)
            return Update(NvmlState(xid=self._nvml.xid_counts(), error=error), success=False)
        self._errors.ok("nvml", "NVML poll works again")
        # Each GPU's failure is logged on its own when it starts or changes (then once a minute while it lasts), so a
        # second GPU failing does not repeat the first one's line.
        for g in gpus:
            if g.error:
                self._errors.error(f"gpu/{g.index}", "NVML GPU read failed", g.error, gpu=g.index)
            else:
                self._errors.ok(f"gpu/{g.index}", "NVML GPU read works again", gpu=g.index)
        match = match_devices(self.ctx.devices, len(gpus), os.environ)
        # The poll succeeded: NVML answered. A lost or wedged GPU is that GPU's metrics.DEVICE_SOURCE_UP 0 (and its
        # JaxmonGpuLost), not a failing collector, which would page for the whole node.
        totals = self._nvlink_totals(gpus)
        return Update(NvmlState(gpus=gpus, xid=self._nvml.xid_counts(), match=match, nvlink_totals=totals))

    def _nvlink_totals(self, gpus: Sequence[GpuReading]) -> dict[int, NvLinkTotals]:
        """Each answering GPU's NVLink counters summed over its links. A link that goes down keeps counting with
        its last reading, so that a sum never falls (a fall would read as a counter reset, and increase() as a
        burst of errors); a link that comes back adds what it counted meanwhile."""
        out = {}
        for gpu in gpus:
            if not gpu.up or gpu.nvlinks is None:
                continue
            seen = self._links.setdefault(gpu.uuid or str(gpu.index), {})
            for link in gpu.nvlinks:
                if link.active:
                    seen[link.link] = link
            out[gpu.index] = sum_links(seen.values())
        return out

    def stop(self) -> None:
        """End the Xid thread and shut NVML down."""
        self._nvml.close()

    def families(self, snap: Snapshot, state: NvmlState) -> Iterator[Metric]:
        """The device-wide families, from the latest poll.

        NVML reports pids in its own PID namespace; they equal the workloads' pids (WORKLOAD_PIDS: the spool's
        reports, an embedded workload itself) only where the sidecar shares the trainer's PID namespace (`docker
        run --pid=container:trainer`, Kubernetes `shareProcessNamespace: true`).
        """
        workloads: dict[int, str] = {}
        for pids in self.ctx.exchange.read(WORKLOAD_PIDS, snap):
            workloads.update(pids)
        yield from render(
            state,
            workloads,
            nvlink_links=self.opts.nvlink_links,
            max_processes=self.opts.max_processes,
            gpm_pipes=self.opts.gpm_pipes,
        )


def _labels(gpu: GpuReading, match: DeviceMatch, mig: MigDevice | None = None) -> dict[str, str]:
    """The labels of every series about one GPU, or about one of its MIG devices: the ONE place they are made.

    They name the device only (`device`, and a MIG device's `mig_uuid`); who owns it is the owner transform's
    (jaxmon.ownership.owners), by the identities this collector offers (`NvmlState.identities`).
    """
    labels = {"device": str(match.device(gpu.index)), "platform": "gpu", "source": SOURCE}
    if mig is not None:
        labels["mig_uuid"] = mig.uuid
        labels["gpu_instance"] = "" if mig.gpu_instance is None else str(mig.gpu_instance)
        labels["compute_instance"] = "" if mig.compute_instance is None else str(mig.compute_instance)
        labels["profile"] = mig.profile or ""
    return labels


def gpu_identities(gpu: GpuReading) -> tuple[DeviceId, ...]:
    """What the owner sources may know a GPU by: its UUID, minor number (/dev/nvidiaN) and PCI bus id."""
    ids = []
    if gpu.uuid is not None:
        ids.append(device_id(GPU_UUID, gpu.uuid))
    if gpu.minor_number is not None:
        ids.append((GPU_MINOR, str(gpu.minor_number)))
    if gpu.pci_bus_id:
        ids.append(device_id(PCI_BUS_ID, gpu.pci_bus_id))
    return tuple(ids)


def render(
    state: NvmlState,
    workloads: Mapping[int, str],
    *,
    nvlink_links: bool = False,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    gpm_pipes: bool = False,
) -> Iterator[Metric]:
    """Every NVML family for `state`; a number NVML did not report is an absent series. NVLink traffic and errors
    are per GPU unless `nvlink_links`; at most `max_processes` processes per GPU get a pid series; GPM's per-pipe
    activity only with `gpm_pipes`."""

    def labels(gpu: GpuReading, mig: MigDevice | None = None) -> dict[str, str]:
        return _labels(gpu, state.match, mig)

    up = metrics.DEVICE_SOURCE_UP.new()
    # The base families render this family for JAX's devices too: same name, same HELP, merged. For
    # source="nvml", device_match says how `device` was assigned (nvml_index: NVML's index, no JAX device id).
    info = metrics.DEVICE_INFO.new()
    for gpu in state.gpus:
        own = labels(gpu)
        add(up, own, 1.0 if gpu.up else 0.0)
        if gpu.uuid is not None:
            identity = {"uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id or "", "name": gpu.name or ""}
            add(info, {**own, **identity, "device_match": state.match.how}, 1.0)
    yield up
    yield info

    ok = [g for g in state.gpus if g.up]
    yield from gpu_families(ok, labels, state.nvlink_totals, nvlink_links, gpm_pipes)

    xid = metrics.DEVICE_XID_ERRORS.new()
    # Xid counts outlive their GPU's readings (NVML may not even count the GPUs now): the reading, or its index.
    by_index = {gpu.index: gpu for gpu in state.gpus}
    for (index, code), count in sorted(state.xid.items()):
        add(xid, {**labels(by_index.get(index) or GpuReading(index=index)), "xid": str(code)}, count)
    yield xid

    yield from _processes(ok, labels, workloads, max_processes)
    yield from process_utilization(ok, labels, workloads, max_processes)


def _processes(
    gpus: Sequence[GpuReading],
    labels: Callable[[GpuReading], dict[str, str]],
    workloads: Mapping[int, str],
    bound: int,
) -> Iterator[Metric]:
    """Each GPU's `bound` largest compute processes by pid, and the rest counted per GPU: a pid is a new series,
    and a GPU shared by many short processes must not grow the exposition without bound."""
    processes = metrics.PROCESS_DEVICE_MEMORY_BYTES.new()
    other_bytes = metrics.PROCESS_DEVICE_MEMORY_OTHER_BYTES.new()
    other_count = metrics.PROCESS_DEVICE_MEMORY_OTHER_PROCESSES.new()
    for gpu in gpus:
        if gpu.processes is None:
            continue
        # A process NVML gives no memory figure for has no series (as before the bound) and is not counted.
        measured = sorted(
            ((p.used_bytes, p.pid) for p in gpu.processes if p.used_bytes is not None), key=lambda m: (-m[0], m[1])
        )
        for used, pid in measured[:bound]:
            own = {**labels(gpu), "pid": str(pid)}
            if pid in workloads:
                own["workload"] = workloads[pid]
            add(processes, own, used)
        rest = measured[bound:]
        add(other_bytes, labels(gpu), sum(used for used, _ in rest))
        add(other_count, labels(gpu), len(rest))
    yield from (processes, other_bytes, other_count)
