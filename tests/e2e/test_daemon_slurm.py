"""A Slurm node end to end: the daemon in node mode with the fake libnvidia-ml.so.1 (tests/fakenvml), whose GPUs list
the pids of processes whose cgroups name Slurm jobs, scraped over HTTP for jaxmon_slurm_job_device_info.

Twice: over a procfs and a sysfs the test writes (`--path.procfs`, `--path.sysfs`: every machine), and with real
child processes in real cgroup v2 cgroups shaped like Slurm's steps, read from the real /proc (where the machine
lets the test make cgroups: tests/cgroup_tree.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cgroup_tree import Cgroups, cgroup_tree, made, write_process
from tests.conftest import StartDaemon
from tests.fakenvml import Scenario, device
from tests.helpers import Samples, sample
from tests.unit.sources.test_cgroups import CID, UID, V2_JOB, v1

POLL = "0.3s"
INFO = "jaxmon_slurm_job_device_info"


def jobs(s: Samples) -> set[tuple[str, str, str, str]]:
    """(job_id, uid, device, uuid) of each jaxmon_slurm_job_device_info series (each must be 1)."""
    out = set()
    for (name, labels), value in s.items():
        if name == INFO:
            assert value == 1.0
            got = dict(labels)
            assert set(got) == {"job_id", "uid", "device", "uuid"}, got
            out.add((got["job_id"], got["uid"], got["device"], got["uuid"]))
    return out


def uuid(index: int) -> str:
    return str(device(index)["uuid"])


def gpus(*pids: tuple[int, ...]) -> list[dict[str, object]]:
    return [device(i, processes=[{"pid": p, "used": 1 << 30} for p in ps]) for i, ps in enumerate(pids)]


def test_a_slurm_nodes_jobs_from_a_procfs_and_sysfs_the_test_writes(start_daemon: StartDaemon, tmp_path: Path) -> None:
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    write_process(procfs, 1, "0::/init.scope\n")
    cgroup_tree(sysfs, "system.slice/slurmstepd.scope/system")  # `auto` turns the collector on for this tree
    write_process(procfs, 1001, V2_JOB.format(77), uid=1500)  # v2: the job's uid is the process's
    write_process(procfs, 1002, v1("/", freezer="/slurm/uid_1600/job_78/step_0/task_0"), started=2000)
    write_process(procfs, 1003, f"0::/kubepods/pod{UID}/{CID}\n")  # a pod's process: no job
    nvml = Scenario(tmp_path / "nvml.json", gpus((1001,), (1001, 4040), (1002,), (1003,)))  # 4040: no such process
    d = start_daemon(
        "--node",
        "--poll.interval",
        POLL,
        "--collector.nvml",
        "--path.procfs",
        str(procfs),
        "--path.sysfs",
        str(sysfs),
        env=nvml.env(),
    )
    want = {("77", "1500", "0", uuid(0)), ("77", "1500", "1", uuid(1)), ("78", "1600", "2", uuid(2))}
    s = d.wait_for(lambda s: jobs(s) == want, what="the jobs' GPUs", timeout=30)
    assert sample(s, "jaxmon_collector_success", collector="slurm") == 1.0
    # The device series carry no job label: the join is at query time.
    assert not [name for name, labels in s if name != INFO and "job_id" in dict(labels)]
    # Job 77 ends; pid 1002 is reused by a process of job 79 (a new start time).
    nvml.update(0, processes=[])
    nvml.update(1, processes=[])
    for name in ("stat", "cgroup", "status"):
        (procfs / "1001" / name).unlink()
    write_process(procfs, 1002, v1("/", freezer="/slurm/uid_1700/job_79/step_1/task_0"), started=3000)
    d.wait_for(lambda s: jobs(s) == {("79", "1700", "2", uuid(2))}, what="job 77 gone, job 79 on GPU 2", timeout=30)


@pytest.fixture
def real_cgroups() -> Iterator[Cgroups]:
    yield from made(None, "the test-written procfs test above runs instead")


def test_real_processes_in_slurm_steps_cgroups(
    start_daemon: StartDaemon, tmp_path: Path, real_cgroups: Cgroups
) -> None:
    step = real_cgroups.spawn("system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")
    batch = real_cgroups.spawn("system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0")
    pod = real_cgroups.spawn(f"kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope")
    host = real_cgroups.spawn("user.slice/user-0.slice/session-1.scope")
    nvml = Scenario(tmp_path / "nvml.json", gpus((step.pid,), (step.pid, batch.pid), (pod.pid, host.pid)))
    # /proc and /sys are the real ones; the tree shows no Slurm there (the steps are under the test's directory), so
    # the collector is asked for.
    d = start_daemon("--node", "--poll.interval", POLL, "--collector.nvml", "--collector.slurm", env=nvml.env())
    uid = str(os.getuid())
    want = {("4242", uid, "0", uuid(0)), ("4242", uid, "1", uuid(1)), ("4243", uid, "1", uuid(1))}
    d.wait_for(lambda s: jobs(s) == want, what="the real steps' GPUs", timeout=30)
    step.kill()
    step.wait()  # the step ends; the scenario still lists its pid (a stale list), which now has no owner
    d.wait_for(lambda s: jobs(s) == {("4243", uid, "1", uuid(1))}, what="job 4242 gone with its process", timeout=30)
