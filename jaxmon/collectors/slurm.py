"""The `slurm` collector: which Slurm job uses which GPU, from the cgroups of the processes NVML reports.

Each poll it takes the pids of every GPU's compute processes from the nvml collector's last poll (the exchange's
GPU_PROCESSES), reads each one's owner from `<--path.procfs>/<pid>/cgroup` (jaxmon.sources.cgroups: Slurm's
`/slurm/uid_U/job_J/step_S` on cgroup v1, `/system.slice/slurmstepd.scope/job_J/step_S` on v2, the uid then the
process's), and renders metrics.SLURM_JOB_DEVICE_INFO (job_id, uid, device, uuid; 1) for each job and GPU. The device
series carry no job label: a query joins them on `uuid` (docs/deploy.md, "Slurm nodes").

A process that ended between NVML's list and the read, or one of no job (the host's, an admin's outside Slurm),
adds nothing. Where the nvml collector does not run, there is nothing to join, and no series.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric
from pydantic import Field

from jaxmon.catalog import metrics
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.exchange import GPU_PROCESSES
from jaxmon.families import add
from jaxmon.settings import CollectorOptions, Enabled
from jaxmon.snapshot import Snapshot
from jaxmon.sources.cgroups import ProcessCgroups, slurm_cgroups


class SlurmOptions(CollectorOptions):
    """`--collector.slurm.*`."""

    enabled: Enabled = Field(
        default="auto",
        description="true, false, or auto (on where the cgroup tree under --path.sysfs shows Slurm's: "
        "system.slice/slurmstepd.scope on cgroup v2, a controller's slurm directory on v1).",
    )


@dataclass(frozen=True, order=True)
class JobDevice:
    """A GPU some process of a Slurm job uses."""

    job_id: str
    uid: str
    device: str
    uuid: str


@dataclass(frozen=True)
class SlurmState:
    """The (job, GPU) pairs of the last poll, in order."""

    devices: tuple[JobDevice, ...] = ()


@register
class SlurmCollector(Collector[SlurmOptions, SlurmState]):
    """Maps the processes on each GPU to their Slurm jobs."""

    name = "slurm"
    description = f"Slurm jobs using each GPU (NVML's processes, their cgroups): {metrics.SLURM_JOB_DEVICE_INFO.name}."
    options = SlurmOptions
    order = 75
    # Slurm's state is not this process's health.
    heartbeat = False

    def __init__(self, opts: SlurmOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        self._owners = ProcessCgroups(ctx.procfs)

    @classmethod
    def unavailable(cls, opts: SlurmOptions, ctx: Context) -> str | None:
        """On `auto`, off unless the cgroup tree shows Slurm (jaxmon.sources.cgroups.slurm_cgroups)."""
        if opts.enabled is True or slurm_cgroups(ctx.procfs, ctx.sysfs) is not None:
            return None
        return (
            f"no Slurm cgroup under {ctx.sysfs / 'fs' / 'cgroup'} (system.slice/slurmstepd.scope, <controller>/slurm)"
        )

    def update(self) -> Update[SlurmState]:
        """The jobs of the processes on each GPU at the nvml collector's last poll."""
        gpus = [gpu for processes in self.ctx.exchange.read(GPU_PROCESSES) for gpu in processes]
        owners = self._owners.read_all(pid for gpu in gpus for pid in gpu.pids)
        found = set()
        for gpu in gpus:
            for pid in gpu.pids:
                job = owners[pid].slurm if pid in owners else None
                if job is not None:
                    found.add(JobDevice(job.job_id, job.uid, gpu.device, gpu.uuid))
        return Update(SlurmState(tuple(sorted(found))))

    def families(self, snap: Snapshot, state: SlurmState) -> Iterator[Metric]:
        info = metrics.SLURM_JOB_DEVICE_INFO.new()
        for d in state.devices:
            add(info, {"job_id": d.job_id, "uid": d.uid, "device": d.device, "uuid": d.uuid}, 1.0)
        yield info
