"""DRA in node mode end to end: the daemon (as deploy/kubernetes/daemonset-node.yaml runs it: NODE_NAME from the
downward API, the service account's token and CA) with the fake kubelet (tests/fake_kubelet.py) reporting claims
beside device-plugin devices and the fake API server (tests/fake_apiserver.py, HTTPS with a test CA) publishing the
node's ResourceSlices, scraped over HTTP: the claimed devices listed with their claim, the API server's health, a
claimed device no slice names counted as a problem, and an API-server outage that turns no known device into one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Daemon, Samples, StartDaemon, sample
from tests.fake_apiserver import FakeApiServer, nvidia_slice, pod_item
from tests.fake_kubelet import FakeKubelet, claim, claimed, container, pod
from tests.fakenvml import Scenario, device, mig_device

NODE = "node-a"
UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(8)]
MIG = "MIG-5e0b7a41-2c3d-5f6e-8a9b-0c1d2e3f4a5b"
SLICES = [nvidia_slice(NODE, [(UUIDS[0], 0), (UUIDS[1], 1), (UUIDS[2], 2)], migs=[(MIG, 2, "1g.10gb")])]
KUBELET_PODS = [
    # A pod holding a GPU through the device plugin and another through a DRA claim.
    pod(
        "team-a",
        "train-0",
        container(
            "trainer",
            {"nvidia.com/gpu": [UUIDS[0]]},
            [claim("train-gpus", "team-a", claimed("gpu.nvidia.com", NODE, "gpu-1"))],
        ),
    ),
    pod(
        "team-b",
        "notebook",
        container("jupyter", claims=[claim("mig", "team-b", claimed("gpu.nvidia.com", NODE, "gpu-2-mig-1g.10gb-0"))]),
    ),
    # A claim on a device the driver has not published: a problem, never a label.
    pod(
        "team-c", "early", container("main", claims=[claim("gpus", "team-c", claimed("gpu.nvidia.com", NODE, "gpu-7"))])
    ),
]
POLL = 0.3


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    fake = FakeApiServer(SLICES, [pod_item(NODE, "team-a", "train-0", "uid-a", {"trainer": "containerd://a1"})])
    fake.start()
    yield fake
    fake.close()


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet(KUBELET_PODS).start()
    yield fake
    fake.close()


def dra_daemon(start_daemon: StartDaemon, kubelet: FakeKubelet, apiserver: FakeApiServer) -> Daemon:
    args, env = apiserver.node_mode(kubelet.socket, NODE)
    # The resourceslice period shortened: each failed refresh in the outage stands for a minute's.
    return start_daemon(
        *args, "--poll.interval", f"{POLL}s", "--collector.kubernetes.resourceslice-interval", "500ms", env=env
    )


def claims(s: Samples) -> set[tuple[str, ...]]:
    keys = ("namespace", "pod", "container", "resource", "device_id", "claim")
    return {
        tuple(dict(labels).get(k, "") for k in keys)
        for name, labels in s
        if name == "jaxmon_kubernetes_pod_device_info" and "claim" in dict(labels)
    }


def problems(s: Samples, reason: str) -> float | None:
    return sample(s, "jaxmon_kubernetes_dra_problems_total", reason=reason)


def failures(s: Samples, reason: str) -> float:
    return sample(s, "jaxmon_kubernetes_api_failures_total", list="resourceslices", reason=reason) or 0.0


def test_claimed_devices_are_listed_and_one_no_slice_names_is_a_problem_through_an_outage(
    start_daemon: StartDaemon, kubelet: FakeKubelet, apiserver: FakeApiServer
) -> None:
    d = dra_daemon(start_daemon, kubelet, apiserver)
    s = d.wait_for(
        lambda s: sample(s, "jaxmon_kubernetes_api_up", list="pods") == 1 and problems(s, "not_in_slices") == 1,
        what="the API server's lists and the unnamed claim",
    )
    assert claims(s) == {
        ("team-a", "train-0", "trainer", "gpu.nvidia.com", f"{NODE}/gpu-1", "train-gpus"),
        ("team-b", "notebook", "jupyter", "gpu.nvidia.com", f"{NODE}/gpu-2-mig-1g.10gb-0", "mig"),
        ("team-c", "early", "main", "gpu.nvidia.com", f"{NODE}/gpu-7", "gpus"),
    }
    # The device-plugin device beside them, without a claim.
    assert (
        sample(
            s,
            "jaxmon_kubernetes_pod_device_info",
            namespace="team-a",
            pod="train-0",
            container="trainer",
            resource="nvidia.com/gpu",
            device_id=UUIDS[0],
        )
        == 1
    )
    assert sample(s, "jaxmon_kubernetes_api_up", list="resourceslices") == 1
    assert problems(s, "no_identity") == 0
    assert sample(s, "jaxmon_kubernetes_api_last_success_timestamp_seconds", list="resourceslices")

    # The API server goes away (503s, then nothing listening): the known devices stay known, so none becomes a
    # problem however many refreshes fail.
    apiserver.update(status=503)
    s = d.wait_for(lambda s: failures(s, "http_503") >= 3, what="three refreshes answered 503")
    apiserver.stop()
    s = d.wait_for(lambda s: failures(s, "unreachable") >= 3, what="three refreshes refused")
    assert sample(s, "jaxmon_kubernetes_api_up", list="resourceslices") == 0
    assert problems(s, "not_in_slices") == 1
    assert sample(s, "jaxmon_collector_success", collector="kubernetes") == 1  # the kubelet's health is its own

    # Back, with the late device published: the claim resolves, and nothing more is counted.
    apiserver.update(
        status=None,
        slices=[nvidia_slice(NODE, [(UUIDS[i], i) for i in (0, 1, 2, 7)], migs=[(MIG, 2, "1g.10gb")])],
    )
    apiserver.start()
    s = d.wait_for(lambda s: sample(s, "jaxmon_kubernetes_api_up", list="resourceslices") == 1, what="the lists")
    assert problems(s, "not_in_slices") == 1


def test_a_refused_token_is_named_and_every_claim_stays_unlabelled(
    start_daemon: StartDaemon, kubelet: FakeKubelet, apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.update(token="another")
    d = dra_daemon(start_daemon, kubelet, apiserver)
    s = d.wait_for(lambda s: failures(s, "unauthorized") >= 1, what="a 401")
    assert sample(s, "jaxmon_kubernetes_api_up", list="resourceslices") == 0
    assert problems(s, "not_in_slices") == 3  # no slice known: each claimed device a problem, none mislabelled


def test_a_pod_holding_gpus_through_dra_only_labels_every_series_of_them_mig_included(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """The owner transform, with the DRA resolution offered beside the device plugins' holders: the NVML series
    of a GPU a pod claimed through DRA carry its pod, as do a claimed MIG device's; an unnamed claim labels nothing."""
    gpus = [device(i) for i in range(3)]
    uuids = [g["uuid"] for g in gpus]
    nvml = Scenario(tmp_path / "nvml.json", gpus)
    mig = mig_device(2, 0, "1g.18gb", 7)
    nvml.update(2, mig={"current": 1, "pending": 1, "max_devices": 7, "devices": [mig]})
    slices = [nvidia_slice(NODE, [(uuids[0], 0), (uuids[1], 1), (uuids[2], 2)], migs=[(mig["uuid"], 2, "1g.18gb")])]

    def claiming(namespace: str, name: str, ctr: str, claim_name: str, dev: str) -> dict[str, object]:
        return pod(
            namespace, name, container(ctr, claims=[claim(claim_name, namespace, claimed("gpu.nvidia.com", NODE, dev))])
        )

    held = [
        claiming("team-a", "train-0", "trainer", "gpus", "gpu-1"),
        claiming("team-b", "notebook", "jupyter", "mig", "gpu-2-mig-1g.18gb-0"),
        claiming("team-c", "early", "main", "gpus", "gpu-7"),
    ]
    server, kubelet = FakeApiServer(slices).start(), FakeKubelet(held).start()
    try:
        args, env = server.node_mode(kubelet.socket, NODE)
        # The resourceslice period shortened: each failed refresh in the outage below stands for a minute's.
        interval = ["--collector.kubernetes.resourceslice-interval", "300ms"]
        d = start_daemon(*args, "--poll.interval", f"{POLL}s", "--collector.nvml", *interval, env={**nvml.env(), **env})
        train = {"namespace": "team-a", "pod": "train-0", "container": "trainer"}
        s = d.wait_for(
            lambda s: (
                sample(s, "jaxmon_device_power_watts", device="1", source="nvml", platform="gpu", **train) is not None
            ),
            what="GPU 1's series labelled with the DRA pod",
        )
        owned: dict[str, set[tuple[str, ...]]] = {}
        for name, labels in s:
            got = dict(labels)
            if "pod" in got and name != "jaxmon_kubernetes_pod_device_info":
                key = got.get("mig_uuid") or got.get("device", "")
                owned.setdefault(key, set()).add((got["namespace"], got["pod"], got["container"]))
        # Every series of GPU 1 carries the pod (not only one family), the MIG device's its own pod, and nothing
        # carries the claim on gpu-7 that no slice names.
        assert owned == {"1": {("team-a", "train-0", "trainer")}, mig["uuid"]: {("team-b", "notebook", "jupyter")}}
        gpu1 = {name for name, labels in s if ("device", "1") in labels and ("source", "nvml") in labels}
        assert {name for name, labels in s if ("pod", "train-0") in labels} >= gpu1 - {"jaxmon_device_source_up"}
        assert problems(s, "not_in_slices") == 1

        # The API server goes away for longer than five periods: no label that was known goes.
        server.stop()
        s = d.wait_for(lambda s: failures(s, "unreachable") >= 5, what="five refreshes refused")
        assert sample(s, "jaxmon_device_power_watts", device="1", source="nvml", platform="gpu", **train) is not None
        assert any(("mig_uuid", mig["uuid"]) in labels and ("pod", "notebook") in labels for _, labels in s)
        assert problems(s, "not_in_slices") == 1
    finally:
        kubelet.close()
        server.close()
