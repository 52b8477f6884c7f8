"""Processes to owners (jaxmon.ownership.pidowners): a process's cgroup (pod UID, container id) named by the API
server's pods, through the kubernetes collector's offer and the owner transform to the labels of its per-process series.
Cgroup files are written under a procfs root of the test's (tests/cgroup_tree.py); the daemon with real cgroups, the
fake NVML, kubelet and API server is tests/e2e/test_daemon_processes.py's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from structlog.testing import capture_logs

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.kubernetes import KubernetesCollector, KubernetesOptions, KubernetesState
from jaxmon.collectors.nvml import NvmlState
from jaxmon.exchange import GpuProcesses, Owner
from jaxmon.ownership.attribution import attribute
from jaxmon.ownership.pidowners import Named, PodProcesses, name_processes
from jaxmon.snapshot import Snapshot
from jaxmon.sources.cgroups import CgroupPod, ProcessCgroup, ProcessCgroups, SlurmJob
from jaxmon.sources.cluster_cache import ApiHealth
from jaxmon.sources.kubelet import Allocation
from jaxmon.sources.kubernetes_api import PodIndex, pod_index
from jaxmon.sources.node import NodeSource
from tests.cgroup_tree import write_process
from tests.fake_apiserver import pod_item
from tests.unit.test_owners import UUIDS, Daemon, gpu, owners_of

UID_A = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
UID_B = "0f8fad5b-d9cb-469f-a165-70867728950e"
UID_GONE = "16fd2706-8baf-433b-82eb-8c7fada847da"
CID_A, CID_B, CID_B2 = "a" * 64, "b" * 64, "c" * 64
PODS = pod_index(
    [
        pod_item("node-a", "team-a", "train-0", UID_A, {"trainer": f"containerd://{CID_A}"}),
        pod_item(
            "node-a", "team-b", "notebook", UID_B, {"jupyter": f"cri-o://{CID_B}", "sidecar": "cri-o://" + CID_B2}
        ),
    ]
)
TRAIN = Owner("team-a", "train-0", "trainer")
NOTEBOOK = Owner("team-b", "notebook", "jupyter")


class GpuProcessOwners:
    """What the kubernetes collector does with the processes on its GPUs each poll: their cgroups read (the source),
    then named by the pods list (the ownership wing's PodProcesses)."""

    def __init__(self, procfs: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.cgroups = ProcessCgroups(procfs)
        self.naming = PodProcesses(clock)

    @property
    def problems(self) -> int:
        return self.naming.problems

    def update(self, gpus: Iterable[GpuProcesses], pods: PodIndex | None, taken: float | None) -> Named:
        wanted = {pid for gpu in gpus for pid in gpu.pids}
        found = self.cgroups.read_all(wanted) if pods is not None else {}
        return self.naming.update(wanted, found, pods, taken)


def systemd_v2(uid: str, cid: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    )


def crio_v2(uid: str, cid: str) -> str:
    return f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/crio-{cid}.scope\n"


def cgroupfs_v1(uid: str, cid: str) -> str:
    return (
        "".join(
            f"{n}:{c}:/kubepods/besteffort/pod{uid}/{cid}\n"
            for n, c in ((12, "pids"), (5, "memory"), (3, "cpu,cpuacct"))
        )
        + "1:name=systemd:/system.slice/containerd.service\n"
    )


def test_a_processs_pod_and_container_are_named_by_the_pods_list() -> None:
    found = {
        1: ProcessCgroup(CgroupPod(UID_A, CID_A, "containerd")),
        2: ProcessCgroup(CgroupPod(UID_B, CID_B2, "cri-o")),
        3: ProcessCgroup(CgroupPod(UID_B)),  # the pod's own cgroup, no container's
        4: ProcessCgroup(CgroupPod(UID_B, CID_A)),  # a container id the list puts in another pod: no container name
        5: ProcessCgroup(CgroupPod(UID_A, "d" * 64)),  # a container the list does not name yet
        6: ProcessCgroup(slurm=SlurmJob("42", "0", "1000")),  # a Slurm job's: not the kubernetes source's
        7: ProcessCgroup(CgroupPod(UID_GONE, CID_A)),  # a pod the list does not have
    }
    named = name_processes(found, PODS)
    assert named.pids == {
        1: frozenset({TRAIN}),
        2: frozenset({Owner("team-b", "notebook", "sidecar")}),
        3: frozenset({Owner("team-b", "notebook", "")}),
        4: frozenset({Owner("team-b", "notebook", "")}),
        5: frozenset({Owner("team-a", "train-0", "")}),
        7: frozenset(),
    }
    assert named.unlisted == {7: UID_GONE}


def test_cgroup_v1_and_v2_paths_go_through_to_the_labels_of_each_processs_own_series(tmp_path: Path) -> None:
    """Three processes on one GPU that three pods share (the kubelet's replicas): cgroup v2 with containerd, v2 with
    CRI-O, v1 with the cgroupfs driver. Each per-process series carries its own pod; one of a pod the list does not
    name carries none (never the GPU's holders); a host process keeps the GPU's; the GPU's series list all three."""
    write_process(tmp_path, 301, systemd_v2(UID_A, CID_A))
    write_process(tmp_path, 302, crio_v2(UID_B, CID_B))
    write_process(tmp_path, 303, cgroupfs_v1(UID_GONE, CID_B2))
    write_process(tmp_path, 304, "0::/system.slice/nvidia-persistenced.service\n")
    processes = GpuProcessOwners(tmp_path, clock=lambda: 10.0)
    named = processes.update([GpuProcesses("0", UUIDS[0], (301, 302, 303, 304))], PODS, taken=11.0)
    held = tuple(
        Allocation(ns, pod, ctr, "nvidia.com/gpu", (f"{UUIDS[0]}::{n}",))
        for n, (ns, pod, ctr) in enumerate(
            [("team-a", "train-0", "trainer"), ("team-b", "notebook", "jupyter"), ("team-c", "early", "main")]
        )
    )
    daemon = Daemon([])
    nvml = NvmlState(gpus=(gpu(0, pids=(301, 302, 303, 304)),))
    kubernetes = KubernetesState(devices=held, attribution=attribute(held), taken=0.0, processes=named.pids)
    snap = daemon.snapshot(nvml)
    got = daemon.scrape(replace(snap, states={**snap.states, "kubernetes": kubernetes}))
    memory = {labels["pid"]: owners_of(labels) for name, labels in got if name == "jaxmon_process_device_memory_bytes"}
    shared = {"namespace": "team-a,team-b,team-c", "pod": "early,notebook,train-0", "container": "jupyter,main,trainer"}
    assert memory == {
        "301": {"namespace": "team-a", "pod": "train-0", "container": "trainer"},
        "302": {"namespace": "team-b", "pod": "notebook", "container": "jupyter"},
        "303": {},
        "304": shared,
    }
    power = [owners_of(labels) for name, labels in got if name == "jaxmon_device_power_watts"]
    assert power == [shared]
    assert processes.problems == 1


def test_a_pod_no_list_after_its_process_names_is_counted_once(tmp_path: Path) -> None:
    write_process(tmp_path, 7, systemd_v2(UID_GONE, CID_A))
    gpus = [GpuProcesses("0", UUIDS[0], (7,))]
    clock = [10.0]
    processes = GpuProcessOwners(tmp_path, clock=lambda: clock[0])
    with capture_logs() as logs:
        assert processes.update(gpus, pod_index([]), taken=None).pids == {7: frozenset()}  # no list yet: no label
        assert processes.problems == 0
        # The list is older than the process (a pod started since): not named, and no problem yet.
        for _ in range(3):
            clock[0] += 1
            assert processes.update(gpus, pod_index([]), taken=9.0).pids == {7: frozenset()}
        assert processes.problems == 0
        # A list taken since the process was first seen does not name its pod either: one problem, however many polls.
        for _ in range(3):
            clock[0] += 1
            assert processes.update(gpus, pod_index([]), taken=10.5).pids == {7: frozenset()}
    assert processes.problems == 1
    assert [e["pid"] for e in logs if "does not list" in e["event"]] == [7]
    # Listed at last: named, nothing more counted.
    listed = pod_index([pod_item("node-a", "team-c", "late", UID_GONE, {"main": f"containerd://{CID_A}"})])
    assert processes.update(gpus, listed, taken=20.0).pids == {7: frozenset({Owner("team-c", "late", "main")})}
    assert processes.problems == 1


def test_without_the_api_servers_pods_no_process_is_named_and_it_is_said_once(tmp_path: Path) -> None:
    write_process(tmp_path, 7, systemd_v2(UID_A, CID_A))
    processes = GpuProcessOwners(tmp_path)
    with capture_logs() as logs:
        for _ in range(3):
            assert processes.update([GpuProcesses("0", UUIDS[0], (7,))], None, taken=None).pids == {}
    said = [e for e in logs if "NODE_NAME" in e.get("error", "")]
    assert len(said) == 1 and said[0]["log_level"] == "warning", logs
    assert KubernetesState().owners.pids == {}
    assert KubernetesState(processes={7: frozenset({TRAIN})}).owners.pids == {7: frozenset({TRAIN})}


def test_the_unnamed_processes_are_counted_in_the_collectors_family_only_where_pods_are_listed() -> None:
    collector = KubernetesCollector(KubernetesOptions(), standalone_context(NodeSource()))

    def problems(state: KubernetesState) -> list[tuple[dict[str, str], float]]:
        return [
            (dict(s.labels), s.value)
            for fam in collector.families(Snapshot(), state)
            for s in fam.samples
            if s.name == "jaxmon_kubernetes_process_problems_total"
        ]

    listed = KubernetesState(api=ApiHealth(up={"pods": True}), pods=PODS, process_problems=2)
    assert problems(listed) == [({"reason": "pod_not_listed"}, 2.0)]
    assert problems(KubernetesState()) == []  # no API server: nothing named, nothing counted
