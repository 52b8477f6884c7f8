"""The kubernetes collector in-process against the fake kubelet (tests/fake_kubelet.py) and the fake API server
(tests/fake_apiserver.py, HTTPS with a test CA): what its state hands the owners transform for DRA, the resolution by
device identity and the node's pods, and that a poll waits for an on-demand list no longer than its deadline. The
daemon scraped over HTTP is tests/e2e/test_daemon_dra.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.kubernetes import KubernetesCollector, KubernetesOptions
from jaxmon.compose import load_settings
from jaxmon.sources.node import NodeSource
from tests.fake_apiserver import FakeApiServer, nvidia_slice, pod_item
from tests.fake_kubelet import FakeKubelet, claim, claimed, container, pod
from tests.unit.test_dra import claim_holder

NODE = "node-a"
UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(2)]


@pytest.fixture
def apiserver(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(
        [nvidia_slice(NODE, [(UUIDS[0], 0), (UUIDS[1], 1)])],
        [pod_item(NODE, "team-a", "train-0", "uid-a", {"trainer": "containerd://a1"})],
    ).start()
    for name, value in fake.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NODE_NAME", raising=False)
    yield fake
    fake.close()


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    claims = [claim("gpus", "team-a", claimed("gpu.nvidia.com", NODE, "gpu-1"))]
    fake = FakeKubelet([pod("team-a", "train-0", container("trainer", claims=claims))]).start()
    yield fake
    fake.close()


def collector(kubelet: FakeKubelet, apiserver: FakeApiServer, *extra: str) -> KubernetesCollector:
    opts = load_settings(
        [
            "--collector.kubernetes",
            f"--collector.kubernetes.socket={kubelet.socket}",
            f"--collector.kubernetes.service-account={apiserver.account}",
            f"--collector.kubernetes.node-name={NODE}",
            *extra,
        ]
    ).collector_options("kubernetes")
    assert isinstance(opts, KubernetesOptions)
    return KubernetesCollector(opts, standalone_context(NodeSource()))


def test_the_state_holds_the_claimed_gpus_holders_and_the_nodes_pods(
    kubelet: FakeKubelet, apiserver: FakeApiServer
) -> None:
    c = collector(kubelet, apiserver, "--collector.kubernetes.timeout=20s")  # a deadline a loaded machine never hits
    try:
        state = c.update().state  # the first poll waits (up to the kubelet's deadline) for the first lists
        assert state.dra is not None
        assert state.dra.devices == {("uuid", UUIDS[1].lower()): {claim_holder("team-a", "train-0", "trainer", "gpus")}}
        assert state.dra.unresolved == ()
        assert state.pods is not None and state.pods.pods == {"uid-a": ("team-a", "train-0")}
        assert state.pods.containers == {"a1": ("uid-a", "trainer")}
        assert state.api is not None and state.api.up["resourceslices"] is True
        # The device-plugin attribution is unchanged; what the owner transform is offered has DRA's holders too.
        assert state.attribution.gpu(UUIDS[1], None) == {}
        assert state.owners.labels([("uuid", UUIDS[1].lower())]) == {
            "namespace": "team-a",
            "pod": "train-0",
            "container": "trainer",
        }
    finally:
        c.stop()


def test_a_hung_api_server_holds_a_poll_no_longer_than_the_kubelets_deadline(
    kubelet: FakeKubelet, apiserver: FakeApiServer
) -> None:
    apiserver.update(delay_seconds=30)
    c = collector(kubelet, apiserver, "--collector.kubernetes.timeout=500ms")
    try:
        start = time.monotonic()
        update = c.update()
        took = time.monotonic() - start
        assert update.success  # the kubelet answered; the API server's health is its own
        assert took < 10, took  # the deadline (0.5 s) plus the kubelet's call, far under the hung list (30 s)
        assert update.state.dra is not None and [u.reason for u in update.state.dra.unresolved] == ["not_in_slices"]
    finally:
        apiserver.update(delay_seconds=0)
        c.stop()
