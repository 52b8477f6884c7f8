"""The slurm collector over a procfs and a sysfs the test writes (tmp_path): its flags, when `auto` runs it, the jobs
it finds for the processes the nvml collector's state lists (read through the exchange, as the runtime wires it),
and --path.procfs / --path.sysfs reaching it from the settings.

The daemon with the fake NVML and real processes in real cgroups: tests/e2e/test_daemon_slurm.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from jaxmon.collectors.base import Context, standalone_context
from jaxmon.collectors.nvml import NvmlCollector, NvmlState
from jaxmon.collectors.slurm import JobDevice, SlurmCollector, SlurmOptions, SlurmState
from jaxmon.compose import build_runtime, default_settings, load_settings
from jaxmon.exchange import GPU_PROCESSES
from jaxmon.snapshot import Snapshot
from jaxmon.sources.node import NodeSource
from jaxmon.sources.nvml import GpuReading, Process
from tests.cgroup_tree import cgroup_tree, write_process
from tests.unit.sources.test_cgroups import CID, UID, V2_JOB, v1

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(4)]


def options(*argv: str) -> SlurmOptions:
    found = load_settings(list(argv)).collector_options("slurm")
    assert isinstance(found, SlurmOptions)
    return found


def roots(tmp_path: Path) -> tuple[Path, Path]:
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    procfs.mkdir()
    sysfs.mkdir()
    return procfs, sysfs


def context(procfs: Path, sysfs: Path, nvml: NvmlState | None = None) -> Context:
    """A context whose exchange offers the nvml collector's state as the runtime does (its own `offers`)."""
    snap = Snapshot(states={} if nvml is None else {"nvml": nvml})
    ctx = standalone_context(NodeSource(), snapshot=lambda: snap)
    ctx.exchange.offer(GPU_PROCESSES, "nvml", NvmlCollector.offers[GPU_PROCESSES])
    return replace(ctx, procfs=procfs, sysfs=sysfs)


def test_auto_by_default_and_the_paths_are_node_exporters() -> None:
    settings = default_settings()
    assert settings.collector_options("slurm").enabled == "auto"
    assert (settings.path.procfs, settings.path.sysfs) == (Path("/proc"), Path("/sys"))
    given = load_settings(["--collector.slurm", "--path.procfs=/host/proc", "--path.sysfs=/host/sys"])
    assert given.collector_options("slurm").enabled is True
    assert (given.path.procfs, given.path.sysfs) == (Path("/host/proc"), Path("/host/sys"))
    env = load_settings([], environ={"JAXMON_PATH__PROCFS": "/p", "JAXMON_COLLECTOR__SLURM": "false"})
    assert env.path.procfs == Path("/p") and env.collector_options("slurm").enabled is False


def test_auto_runs_where_the_cgroup_tree_shows_slurm(tmp_path: Path) -> None:
    procfs, sysfs = roots(tmp_path)
    (procfs / "1").mkdir()
    (procfs / "1" / "cgroup").write_text("0::/init.scope\n")
    reason = SlurmCollector.unavailable(options(), context(procfs, sysfs))
    assert reason is not None and "no Slurm cgroup" in reason and str(sysfs) in reason
    assert SlurmCollector.unavailable(options("--collector.slurm"), context(procfs, sysfs)) is None
    cgroup_tree(sysfs, "system.slice/slurmstepd.scope")
    assert SlurmCollector.unavailable(options(), context(procfs, sysfs)) is None


def gpu(index: int, *pids: int, up: bool = True) -> GpuReading:
    processes = tuple(Process(pid, 1 << 30) for pid in pids)
    return GpuReading(index=index, uuid=UUIDS[index], processes=processes, error=None if up else "GPU is lost")


def test_each_jobs_gpus_from_its_processes_cgroups(tmp_path: Path) -> None:
    procfs, sysfs = roots(tmp_path)
    write_process(procfs, 10, V2_JOB.format(7), uid=1000)  # job 7 (v2: the process's uid) on GPUs 0 and 1
    write_process(procfs, 11, V2_JOB.format(7), uid=1000)
    write_process(procfs, 20, v1("/", freezer="/slurm/uid_2000/job_8/step_0/task_0"))  # job 8 (v1) on GPU 1
    write_process(procfs, 30, f"0::/kubepods/pod{UID}/{CID}\n")  # a pod's, not a job's
    write_process(procfs, 40, "0::/init.scope\n")  # the host's
    write_process(procfs, 50, V2_JOB.format(9))  # on a GPU that did not answer this poll
    nvml = NvmlState(gpus=(gpu(0, 10, 11), gpu(1, 11, 20, 99), gpu(2, 30, 40), gpu(3, 50, up=False)))
    collector = SlurmCollector(options(), context(procfs, sysfs, nvml))
    update = collector.update()
    assert update.success
    assert update.state == SlurmState(
        (
            JobDevice("7", "1000", "0", UUIDS[0]),
            JobDevice("7", "1000", "1", UUIDS[1]),
            JobDevice("8", "2000", "1", UUIDS[1]),
        )
    )
    got = [
        (s.name, dict(s.labels), s.value) for fam in collector.families(Snapshot(), update.state) for s in fam.samples
    ]
    assert got[0] == (
        "jaxmon_slurm_job_device_info",
        {"job_id": "7", "uid": "1000", "device": "0", "uuid": UUIDS[0]},
        1.0,
    )
    assert len(got) == 3
    # Job 7 ends: its processes are gone; the next poll lists job 8 alone.
    for pid in (10, 11):
        for name in ("stat", "cgroup", "status"):
            (procfs / str(pid) / name).unlink()
    assert collector.update().state == SlurmState((JobDevice("8", "2000", "1", UUIDS[1]),))


def test_without_nvml_there_is_nothing_to_join(tmp_path: Path) -> None:
    procfs, sysfs = roots(tmp_path)
    update = SlurmCollector(options(), context(procfs, sysfs)).update()
    assert update.success and update.state == SlurmState()


def test_the_paths_reach_the_collectors_context(tmp_path: Path) -> None:
    procfs, sysfs = roots(tmp_path)
    cgroup_tree(sysfs, "freezer/slurm")
    settings = load_settings(["--node", "--path.procfs", str(procfs), "--path.sysfs", str(sysfs)])
    runtime = build_runtime(settings, NodeSource())
    try:
        (slurm,) = [c for c in runtime.collectors if c.name == "slurm"]  # auto: the tree shows Slurm
        assert (slurm.ctx.procfs, slurm.ctx.sysfs) == (procfs, sysfs)
    finally:
        runtime.stop()
    elsewhere = load_settings(["--node", "--path.procfs", str(procfs), "--path.sysfs", str(tmp_path / "none")])
    runtime = build_runtime(elsewhere, NodeSource())
    try:
        assert "slurm" not in [c.name for c in runtime.collectors]
    finally:
        runtime.stop()
