"""Owners of real processes in real cgroups: child processes moved into cgroups shaped like a Kubernetes pod's
container or a Slurm step's (under a directory of the test's own: tests/cgroup_tree.py), their owner read by
jaxmon.sources.cgroups from the real /proc/<pid>/cgroup the kernel writes. Where the machine does not let a test make
cgroups (not root, no writable hierarchy), these skip saying why; the same paths are read from a procfs root the
tests write in tests/unit/sources/test_cgroups.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxmon.sources.cgroups import CgroupPod, ProcessCgroup, ProcessCgroups, SlurmJob, process_cgroup
from tests.cgroup_tree import Cgroups, made

UID = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
CID = "0123456789abcdef" * 4


INSTEAD = "tests/unit/sources/test_cgroups.py reads the paths"


@pytest.fixture
def v2() -> Iterator[Cgroups]:
    yield from made(None, INSTEAD)


@pytest.fixture
def v1_freezer() -> Iterator[Cgroups]:
    yield from made("freezer", INSTEAD)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope",
            ProcessCgroup(pod=CgroupPod(UID, CID, "containerd")),
        ),
        (
            f"kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
            ProcessCgroup(CgroupPod(UID, CID, "cri-o")),
        ),
        (f"kubepods/besteffort/pod{UID}/{CID}", ProcessCgroup(pod=CgroupPod(UID, CID))),
        (
            "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
            ProcessCgroup(slurm=SlurmJob("4242", "0", str(os.getuid()))),
        ),
        ("system.slice/slurmstepd.scope/system", None),  # slurmstepd itself
        ("user.slice/user-1000.slice/session-1.scope", None),
    ],
    ids=["containerd", "cri-o", "cgroupfs", "slurm-v2", "slurmstepd", "session"],
)
def test_a_process_in_a_cgroup_v2_tree_has_the_owner_its_path_names(
    v2: Cgroups, path: str, expected: ProcessCgroup | None
) -> None:
    child = v2.spawn(path)
    line = f"0::{v2.path_of(path)}"
    assert line in Path(f"/proc/{child.pid}/cgroup").read_text().splitlines()  # the kernel's own spelling
    owners = ProcessCgroups()
    assert owners.read(child.pid) == expected
    assert owners.read_all([child.pid]) == ({} if expected is None else {child.pid: expected})


def test_a_process_in_a_slurm_v1_step_has_its_job_and_uid(v1_freezer: Cgroups) -> None:
    """A hybrid or legacy host: the job's freezer cgroup names it (the process's other hierarchies may name anything:
    on this project's VM, its memory cgroup is the test runner's)."""
    child = v1_freezer.spawn("slurm/uid_1234/job_77/step_batch/task_0")
    text = Path(f"/proc/{child.pid}/cgroup").read_text()
    assert f"freezer:{v1_freezer.path_of('slurm/uid_1234/job_77/step_batch/task_0')}" in text
    assert process_cgroup(text) == ProcessCgroup(slurm=SlurmJob("77", "batch", "1234"))
    assert ProcessCgroups().read(child.pid) == ProcessCgroup(slurm=SlurmJob("77", "batch", "1234"))


def test_an_owner_follows_a_process_moved_to_another_job_only_when_its_pid_is_new(v2: Cgroups) -> None:
    """The cache is keyed by pid and start time: a process stays whose it was when first read (Slurm and the kubelet
    never move a process between jobs or pods), and a process that ended leaves nothing behind."""
    child = v2.spawn("system.slice/slurmstepd.scope/job_1/step_0")
    owners = ProcessCgroups()
    assert owners.read(child.pid) == ProcessCgroup(slurm=SlurmJob("1", "0", str(os.getuid())))
    child.kill()
    child.wait()
    assert owners.read(child.pid) is None and owners.cached() == 0
    other = v2.spawn("system.slice/slurmstepd.scope/job_2/step_0")
    assert owners.read(other.pid) == ProcessCgroup(slurm=SlurmJob("2", "0", str(os.getuid())))
