"""Processes to owners end to end: the daemon in node mode (as deploy/kubernetes/daemonset-node.yaml runs it: hostPID,
NODE_NAME, the service account) with the fake NVML reporting three processes on one time-sliced GPU, the fake kubelet
giving that GPU to three pods (a replica each), and the fake API server listing the three pods with their UIDs and
container ids. The processes are real children in real cgroups shaped like those pods' containers (tests/
cgroup_tree.py; where the machine does not let a test make cgroups, the same paths in a procfs root the test writes,
--path.procfs). Each pod gets its own per-process memory and SM utilization series; the GPU's series keep all three
holders."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cgroup_tree import Cgroups, hierarchy, usable, write_process
from tests.conftest import Samples, StartDaemon, sample
from tests.fake_apiserver import FakeApiServer, pod_item
from tests.fake_kubelet import FakeKubelet, container, pod
from tests.fakenvml import Scenario, device

NODE = "node-a"
GIB = 1 << 30
# (namespace, pod, container, pod UID, container id, runtime's cgroup spelling, SM %, memory GiB)
PODS = [
    ("team-a", "train-0", "trainer", "7c9e6679-7425-40de-944b-e07fc1f90ae7", "a1" * 32, "cri-containerd", 70, 20),
    ("team-b", "notebook", "jupyter", "0f8fad5b-d9cb-469f-a165-70867728950e", "b2" * 32, "cri-containerd", 20, 6),
    ("team-c", "infer", "server", "16fd2706-8baf-433b-82eb-8c7fada847da", "c3" * 32, "crio", 5, 2),
]
POLL = 0.3


def cgroup_path(uid: str, cid: str, runtime: str) -> str:
    return (
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"{runtime}-{cid}.scope"
    )


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[tuple[list[int], list[str]]]:
    """Three processes, one in each pod's container cgroup: real ones where cgroups can be made (no extra flags),
    else pids written in a procfs root (`--path.procfs` it)."""
    mount = hierarchy(None)
    if usable(mount) is None and mount is not None:
        made = Cgroups(mount)
        try:
            children = [made.spawn(cgroup_path(uid, cid, rt)) for _, _, _, uid, cid, rt, _, _ in PODS]
            yield [c.pid for c in children], []
        finally:
            made.close()
        return
    procfs = tmp_path / "proc"
    pids = [os.getpid() + 100_000 + n for n in range(len(PODS))]  # no real process needs them
    for pid, (_, _, _, uid, cid, rt, _, _) in zip(pids, PODS, strict=True):
        write_process(procfs, pid, f"0::/{cgroup_path(uid, cid, rt)}\n")
    yield pids, ["--path.procfs", str(procfs)]


def test_each_pod_sharing_a_time_sliced_gpu_gets_its_own_process_series_and_the_gpu_keeps_all_three(
    start_daemon: StartDaemon, tmp_path: Path, processes: tuple[list[int], list[str]]
) -> None:
    pids, flags = processes
    gpu = device(0)
    running = [
        {"pid": pid, "used": mem * GIB, "utilization": {"sm": sm, "memory": sm // 2, "encoder": 0, "decoder": 0}}
        for pid, (*_, sm, mem) in zip(pids, PODS, strict=True)
    ]
    gpu["processes"] = running[:2]  # the third pod starts later
    nvml = Scenario(tmp_path / "nvml.json", [gpu])
    held = [
        pod(ns, name, container(ctr, {"nvidia.com/gpu": [f"{gpu['uuid']}::{n}"]}))
        for n, (ns, name, ctr, *_) in enumerate(PODS)
    ]
    runtimes = {"cri-containerd": "containerd", "crio": "cri-o"}
    listed = [
        pod_item(NODE, ns, name, uid, {ctr: f"{runtimes[rt]}://{cid}"}) for ns, name, ctr, uid, cid, rt, *_ in PODS
    ]
    server, kubelet = FakeApiServer([], listed[:2]).start(), FakeKubelet(held).start()
    try:
        args, env = server.node_mode(kubelet.socket, NODE)
        # The lists' period is an hour: the third pod below is named only if its process asks for a list at once.
        args += ["--collector.kubernetes.resourceslice-interval", "1h"]
        d = start_daemon(*args, "--poll.interval", f"{POLL}s", "--collector.nvml", *flags, env={**nvml.env(), **env})

        def own(s: Samples, family: str) -> dict[str, tuple[str, str, str, float]]:
            return {
                dict(labels)["pid"]: (
                    dict(labels).get("namespace", ""),
                    dict(labels).get("pod", ""),
                    dict(labels).get("container", ""),
                    value,
                )
                for (name, labels), value in s.items()
                if name == family
            }

        expected_pods = {str(pid): (ns, name, ctr) for pid, (ns, name, ctr, *_) in zip(pids, PODS, strict=True)}
        first = dict(list(expected_pods.items())[:2])
        d.wait_for(
            lambda s: {p: v[:3] for p, v in own(s, "jaxmon_process_sm_utilization_ratio").items()} == first,
            what="the first two pods' processes named",
        )
        # The third pod is scheduled (the API server lists it), then its process starts on the GPU.
        server.update(pods=listed)
        nvml.update(0, processes=running)
        s = d.wait_for(
            lambda s: {p: v[:3] for p, v in own(s, "jaxmon_process_sm_utilization_ratio").items()} == expected_pods,
            what="each process's SM series with its own pod",
        )
        for pid, (ns, name, ctr, _, _, _, sm, mem) in zip(pids, PODS, strict=True):
            assert own(s, "jaxmon_process_sm_utilization_ratio")[str(pid)] == (ns, name, ctr, sm / 100)
            assert own(s, "jaxmon_process_device_memory_bytes")[str(pid)] == (ns, name, ctr, mem * GIB)
        # The GPU's own series: one label set, the three holders joined, as before.
        joined = {
            "namespace": "team-a,team-b,team-c",
            "pod": "infer,notebook,train-0",
            "container": "jupyter,server,trainer",
        }
        assert sample(s, "jaxmon_device_power_watts", device="0", source="nvml", platform="gpu", **joined) is not None
        assert sample(s, "jaxmon_kubernetes_process_problems_total", reason="pod_not_listed") == 0
    finally:
        kubelet.close()
        server.close()
