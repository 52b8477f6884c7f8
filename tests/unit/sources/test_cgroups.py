"""Processes to owners from their cgroups (jaxmon.sources.cgroups): every spelling of Kubernetes' and Slurm's cgroup
paths as literal /proc/<pid>/cgroup text, and the reader over a procfs root the test writes (tmp_path): its cache by
start time, a pid that vanished or was reused, its bound, and where the cgroup tree shows Slurm.

Real processes in cgroups the test makes: tests/e2e/sources/test_cgroups.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from jaxmon.sources.cgroups import (
    CgroupPod,
    ProcessCgroup,
    ProcessCgroups,
    SlurmJob,
    process_cgroup,
    real_uid,
    slurm_cgroups,
    start_time,
)
from tests.cgroup_tree import cgroup_tree, write_process

UID = "3f6c1a2b-9d4e-4f5a-8b7c-0d1e2f3a4b5c"
SYSTEMD_UID = UID.replace("-", "_")
STATIC_UID = "6d4cbd2b8e1e4b5a9f0a1b2c3d4e5f60"  # a static pod's: the kubelet's hash of its manifest
CID = "4b825dc642cb6eb9a060e54bf8d69288fbee4904" + "a1b2c3d4e5f60718293a"  # 64 hex digits
KIND_NODE = "9e1f" * 16
# The v1 hierarchies of a host in legacy mode, as /proc/<pid>/cgroup lists them, each with `{}` for the path.
V1 = [
    "12:hugetlb:{}",
    "11:freezer:{}",
    "10:cpu,cpuacct:{}",
    "9:memory:{}",
    "8:pids:{}",
    "7:devices:{}",
    "6:blkio:{}",
    "5:net_cls,net_prio:{}",
    "4:cpuset:{}",
    "3:perf_event:{}",
    "2:rdma:{}",
    "1:name=systemd:{}",
]


def v1(path: str, **others: str) -> str:
    """A legacy host's cgroup file with `path` in every hierarchy but those `others` names (controller=path)."""
    lines = []
    for line in V1:
        controllers = line.split(":")[1].replace("name=", "").replace(",", "_")
        lines.append(line.format(others.get(controllers, path)))
    return "\n".join(lines) + "\n"


def pod(uid: str = UID, container: str = CID, runtime: str = "") -> ProcessCgroup:
    return ProcessCgroup(pod=CgroupPod(uid, container, runtime))


def job(job_id: str, step: str, uid: str = "") -> ProcessCgroup:
    return ProcessCgroup(slurm=SlurmJob(job_id, step, uid))


KUBERNETES = [
    # cgroup v2, systemd driver (kubelet's default since 1.22 with cgroup v2), each QoS class and runtime.
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        pod(runtime="containerd"),
    ),
    (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n",
        pod(runtime="cri-o"),
    ),
    (f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n", pod(runtime="docker")),
    # CRI-O's conmon sits in the pod's slice, beside the container: the pod's, no container's.
    (f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-conmon-{CID}.scope\n", pod(container="")),
    # A process in the container's scope's own child cgroup (systemd or a nested runtime inside the container).
    (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope/init.scope\n",
        pod(runtime="containerd"),
    ),
    # cgroupfs driver (k3s, older kubeadm): bare ids; CRI-O's crio-<id>.
    (f"0::/kubepods/burstable/pod{UID}/{CID}\n", pod()),
    (f"0::/kubepods/besteffort/pod{UID}/{CID}\n", pod()),
    (f"0::/kubepods/pod{UID}/{CID}\n", pod()),
    (f"0::/kubepods/pod{UID}/crio-{CID}\n", pod(runtime="cri-o")),
    (f"0::/kubepods/pod{STATIC_UID}/{CID}\n", pod(uid=STATIC_UID)),
    # The node in a container (kind): a prefix before the kubelet's tree, and its cgroup root in the slices' names.
    (
        f"0::/system.slice/docker-{KIND_NODE}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        pod(runtime="containerd"),
    ),
    (v1(f"/docker/{KIND_NODE}/kubelet/kubepods/burstable/pod{UID}/{CID}"), pod()),
    # cgroup v1: one line per hierarchy, the same path in each.
    (
        v1(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/docker-{CID}.scope"),
        pod(runtime="docker"),
    ),
    (v1(f"/kubepods/burstable/pod{UID}/{CID}"), pod()),
]

SLURM = [
    # cgroup v1 (task/cgroup and proctrack/cgroup in freezer, memory, cpuset, devices; the rest at the root).
    (
        v1(
            "/",
            freezer="/slurm/uid_1000/job_4242/step_0/task_1",
            memory="/slurm/uid_1000/job_4242/step_0/task_1",
            cpuset="/slurm/uid_1000/job_4242/step_0",
            devices="/slurm/uid_1000/job_4242/step_0",
            systemd="/system.slice/slurmd.service",
        ),
        job("4242", "0", "1000"),
    ),
    (v1("/", freezer="/slurm/uid_0/job_7/step_batch/task_0"), job("7", "batch", "0")),
    (v1("/", memory="/slurm_node01/uid_1001/job_8/step_extern"), job("8", "extern", "1001")),
    # cgroup v2: no uid in the path (ProcessCgroups takes the process's).
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1\n", job("4242", "0")),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0\n", job("4242", "batch")),
    ("0::/system.slice/slurmstepd.scope/job_99/step_interactive/slurm\n", job("99", "interactive")),
    ("0::/system.slice/node02_slurmstepd.scope/job_5/step_extern/user\n", job("5", "extern")),
    ("0::/slurm.slice/n.example.org_slurmstepd.scope/job_6/step_batch/user/task_special\n", job("6", "batch")),
    ("0::/system.slice/slurmstepd.scope/job_5\n", job("5", "")),
    # A hybrid host: systemd's v2 tree at its root, Slurm's v1 controllers.
    (v1("/", freezer="/slurm/uid_1000/job_1/step_0") + "0::/\n", job("1", "0", "1000")),
]

NOBODY = [
    "0::/init.scope\n",
    "0::/system.slice/containerd.service\n",
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    f"0::/system.slice/docker-{CID}.scope\n",  # a plain container, no pod
    "0::/system.slice/slurmstepd.scope/system\n",  # slurmstepd itself, no job's
    "0::/system.slice/slurmd.service\n",
    f"0::/pod{UID}/{CID}\n",  # a pod-like name outside the kubelet's tree
    "0::/kubepods.slice/kubepods-burstable.slice\n",  # the QoS class's own cgroup
    "0::/kubepods.slice/kubepods-podnot_a_uid.slice/x.scope\n",
    "0::/\n",
    v1("/"),
    "",
    "garbage\n:no:\n",
]


@pytest.mark.parametrize(("text", "expected"), KUBERNETES + SLURM, ids=lambda v: str(v)[:90])
def test_each_spelling_of_a_pod_or_a_jobs_cgroup_names_its_owner(text: str, expected: ProcessCgroup) -> None:
    assert process_cgroup(text) == expected


@pytest.mark.parametrize("text", NOBODY, ids=lambda v: v[:60])
def test_processes_of_neither_have_no_owner(text: str) -> None:
    assert process_cgroup(text) is None


def test_a_slurm_job_inside_a_pod_is_both() -> None:
    """slurmd in Kubernetes (Slurm on Kubernetes operators): the job's cgroups are inside the pod's."""
    text = (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope/system.slice/"
        "slurmstepd.scope/job_12/step_0/user/task_0\n"
    )
    assert process_cgroup(text) == ProcessCgroup(CgroupPod(UID, CID, "containerd"), SlurmJob("12", "0"))


def test_the_v2_line_wins_and_v1_lines_are_read_in_one_order_whatever_theirs() -> None:
    """Where hierarchies disagree (a v1 controller moved by hand, systemd's own tree elsewhere), the choice is fixed:
    the v2 line, then memory, freezer, cpuset, devices, ..., name=systemd last; never the file's line order."""
    other = f"/kubepods/pod{UID.replace('3f6c', '0000')}/{CID}"
    text = v1("/", memory="/slurm/uid_5/job_1/step_0", freezer="/slurm/uid_5/job_2/step_0", systemd=other)
    lines = text.splitlines()
    for seed in range(5):
        random.Random(seed).shuffle(lines)
        assert process_cgroup("\n".join(lines)) == job("1", "0", "5")
    assert process_cgroup(text + f"0::/kubepods/pod{UID}/{CID}\n") == pod()
    only_systemd = v1("/", systemd=other)
    assert process_cgroup(only_systemd) == ProcessCgroup(CgroupPod(UID.replace("3f6c", "0000"), CID))


def test_start_time_and_real_uid_read_procs_own_formats() -> None:
    # A command name with spaces and parentheses: fields are counted after its last ')'.
    stat = "4242 (python (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 7 3 0 0 20 0 9 0 987654 1 2 3\n"
    assert start_time(stat) == 987654
    assert start_time("1 (x) S 1 2") is None
    status = "Name:\tpython\nUmask:\t0022\nState:\tS\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n"
    assert real_uid(status) == "1000"
    assert real_uid("Name:\tx\n") == ""


V2_JOB = "0::/system.slice/slurmstepd.scope/job_{}/step_0/user/task_0\n"


def test_an_owner_is_read_once_per_process_and_afresh_for_a_reused_pid(tmp_path: Path) -> None:
    write_process(tmp_path, 300, V2_JOB.format(11), started=5000, uid=1234)
    owners = ProcessCgroups(tmp_path)
    assert owners.read(300) == job("11", "0", "1234")  # v2: the uid is the process's
    # The same process (same start time): the cached owner, the cgroup file not read again.
    (tmp_path / "300" / "cgroup").write_text(V2_JOB.format(99))
    assert owners.read(300) == job("11", "0", "1234")
    # The pid reused by a new process (another start time): read again.
    write_process(tmp_path, 300, V2_JOB.format(12), started=7000, uid=2000)
    assert owners.read(300) == job("12", "0", "2000")


def test_a_vanished_pid_has_no_owner_and_logs_nothing(tmp_path: Path) -> None:
    write_process(tmp_path, 301, f"0::/kubepods/pod{UID}/{CID}\n")
    owners = ProcessCgroups(tmp_path)
    assert owners.read(301) == pod()
    for name in ("cgroup", "status", "stat"):
        (tmp_path / "301" / name).unlink()
    (tmp_path / "301").rmdir()
    with capture_logs() as logs:
        for _ in range(50):
            assert owners.read(301) is None
            assert owners.read(302) is None  # never there
            assert owners.read_all([301, 302, 303]) == {}
    assert logs == []
    assert owners.cached() == 0


def test_a_process_gone_between_its_reads_is_not_cached(tmp_path: Path) -> None:
    """The pid's stat is read before and after its cgroup: a start time that changed means another process."""

    class Reused(ProcessCgroups):
        calls = 0

        def _started(self, pid: int) -> int | None:
            self.calls += 1
            return self.calls  # a different process at each read

    write_process(tmp_path, 303, V2_JOB.format(3))
    owners = Reused(tmp_path)
    assert owners.read(303) is None
    assert owners.cached() == 0


def test_an_unreadable_proc_is_logged_once_not_per_poll(tmp_path: Path) -> None:
    write_process(tmp_path, 304, "")
    (tmp_path / "304" / "cgroup").unlink()
    (tmp_path / "304" / "cgroup").mkdir()  # reading it fails with an OSError that is not "gone"
    owners = ProcessCgroups(tmp_path)
    with capture_logs() as logs:
        for _ in range(20):
            assert owners.read_all([304]) == {}
            owners._cache.clear()  # read it again each time, as new processes would be
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1 and "304/cgroup" in warnings[0]["error"], logs


def test_the_cache_holds_the_polls_pids_and_at_most_its_bound(tmp_path: Path) -> None:
    for pid in range(400, 420):
        write_process(tmp_path, pid, v1("/", freezer=f"/slurm/uid_7/job_{pid}/step_0"))
    write_process(tmp_path, 420, "0::/init.scope\n")
    owners = ProcessCgroups(tmp_path, max_cached=8)
    found = owners.read_all(range(400, 421))
    assert sorted(found) == list(range(400, 420))  # the host's process has no owner
    assert found[405] == job("405", "0", "7")
    assert owners.cached() == 8
    owners = ProcessCgroups(tmp_path)
    owners.read_all(range(400, 421))
    assert owners.cached() == 21  # processes of no owner are remembered too: not read again
    owners.read_all([401, 402])
    assert owners.cached() == 2  # those NVML no longer reports are forgotten


@pytest.mark.parametrize(
    ("pid1", "dirs", "found"),
    [
        ("0::/init.scope\n", ["system.slice/slurmstepd.scope/system"], "system.slice/slurmstepd.scope"),
        ("0::/init.scope\n", ["system.slice/n1_slurmstepd.scope"], "system.slice/n1_slurmstepd.scope"),
        (
            "0::/init.scope\n",
            ["slurm.slice/n.example.org_slurmstepd.scope"],
            "slurm.slice/n.example.org_slurmstepd.scope",
        ),
        (
            "0::/init.scope\n",
            ["hpc.slice/hpc-jobs.slice/slurmstepd.scope"],
            "hpc.slice/hpc-jobs.slice/slurmstepd.scope",
        ),
        (v1("/init.scope"), ["freezer/slurm/uid_0", "memory"], "freezer/slurm"),
        (v1("/init.scope"), ["cpuset/slurm_n1"], "cpuset/slurm_n1"),
        # A hybrid host: the v2 tree under unified/, v1 controllers beside it.
        (
            v1("/") + "0::/init.scope\n",
            ["unified/system.slice/slurmstepd.scope"],
            "unified/system.slice/slurmstepd.scope",
        ),
        (None, ["devices/slurm"], "devices/slurm"),  # /proc/1/cgroup unreadable: every place looked at
        (None, ["system.slice/slurmstepd.scope"], "system.slice/slurmstepd.scope"),
        # No Slurm: its daemons' units, other names, a v1 tree a v2-only host does not have.
        ("0::/init.scope\n", ["system.slice/slurmd.service", "system.slice/slurmstepd.service"], None),
        ("0::/init.scope\n", ["memory/slurm", "kubepods.slice"], None),
        (v1("/init.scope"), ["freezer/slurmish", "freezer/kubepods"], None),
        (None, [], None),
    ],
)
def test_the_cgroup_tree_shows_slurm_or_not(
    tmp_path: Path, pid1: str | None, dirs: list[str], found: str | None
) -> None:
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    cgroup_tree(sysfs, *dirs)
    if pid1 is not None:
        (procfs / "1").mkdir(parents=True)
        (procfs / "1" / "cgroup").write_text(pid1)
    expected = None if found is None else sysfs / "fs" / "cgroup" / found
    assert slurm_cgroups(procfs, sysfs) == expected
