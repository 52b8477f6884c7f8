"""The API server source's parts that need no server: in-cluster configuration, the PodList index, the cache's
keeping of the last good answer and its rate limit, its health families (tests/e2e/sources/test_kubernetes_api.py
drives it against a server over TLS)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from jaxmon.collectors.kubernetes import health_families
from jaxmon.sources.cluster_cache import ApiHealth, ClusterCache
from jaxmon.sources.kubernetes_api import ApiClient, ApiError, InCluster, PodIndex, pod_index
from tests.helpers import wait_until

PODS = json.loads(
    """
{"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": [
  {"metadata": {"name": "train-0", "namespace": "team", "uid": "0d9c1b2a-1111-2222-3333-444455556666"},
   "spec": {"nodeName": "node-a"},
   "status": {"phase": "Running",
     "initContainerStatuses": [{"name": "setup", "containerID": "containerd://aaa111", "ready": false}],
     "containerStatuses": [
       {"name": "main", "containerID": "containerd://bbb222", "ready": true},
       {"name": "sidecar", "containerID": "cri-o://ccc333", "ready": true},
       {"name": "waiting", "ready": false}]}},
  {"metadata": {"name": "pending", "namespace": "team", "uid": "9f8e7d6c-0000-0000-0000-000000000001"},
   "status": {"phase": "Pending"}},
  {"metadata": {"name": "no-uid", "namespace": "team"}}
]}
"""
)


def test_pods_are_indexed_by_uid_and_bare_container_id() -> None:
    index = pod_index(PODS["items"])
    assert index.pods == {
        "0d9c1b2a-1111-2222-3333-444455556666": ("team", "train-0"),
        "9f8e7d6c-0000-0000-0000-000000000001": ("team", "pending"),
    }
    uid = "0d9c1b2a-1111-2222-3333-444455556666"
    assert index.containers == {"aaa111": (uid, "setup"), "bbb222": (uid, "main"), "ccc333": (uid, "sidecar")}


def _account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("t0k3n\n")
    (tmp_path / "ca.crt").write_text("not read here")
    return tmp_path


def test_in_cluster_configuration_comes_from_the_service_variables_and_account(tmp_path: Path) -> None:
    account = _account(tmp_path)
    config = InCluster.from_env({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, account)
    assert config == InCluster("10.96.0.1", 443, account / "token", account / "ca.crt")


@pytest.mark.parametrize(
    ("env", "remove", "message"),
    [
        ({}, None, "KUBERNETES_SERVICE_HOST"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "https"}, None, "'https', not a port"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "443"}, "token", "token does not exist"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "443"}, "ca.crt", "ca.crt does not exist"),
    ],
)
def test_a_missing_configuration_is_named(
    tmp_path: Path, env: dict[str, str], remove: str | None, message: str
) -> None:
    account = _account(tmp_path)
    if remove:
        (account / remove).unlink()
    with pytest.raises(ApiError, match=message) as err:
        InCluster.from_env(env, account)
    assert err.value.code == "config"


def test_the_token_is_read_again_when_the_kubelet_rotates_it(tmp_path: Path) -> None:
    account = _account(tmp_path)
    client = ApiClient(InCluster("h", 443, account / "token", account / "ca.crt"))
    assert client.token() == "t0k3n"
    # The kubelet writes a projected token into a new file and swaps a symlink: a new inode.
    (account / "token.new").write_text("r0t4t3d")
    (account / "token.new").replace(account / "token")
    assert client.token() == "r0t4t3d"


class _Lists(ApiClient):
    """An ApiClient whose lists answer from memory (the cache's logic without a server; e2e has the server)."""

    def __init__(self) -> None:
        self.slices: list[dict[str, Any]] = []
        self.pod_items: list[dict[str, Any]] = []
        self.error: ApiError | None = None
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def resource_slices(self, node: str) -> list[dict[str, Any]]:
        self.gate.wait()
        self.calls += 1
        if self.error:
            raise self.error
        return self.slices

    def pods(self, node: str) -> list[dict[str, Any]]:
        if self.error:
            raise self.error
        return self.pod_items


def _slice(*names: str) -> dict[str, Any]:
    devices = [{"name": n, "attributes": {"uuid": {"string": f"GPU-{n}"}}} for n in names]
    return {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n"}, "devices": devices}}


def test_a_failed_refresh_keeps_the_last_good_answer_and_counts_the_failure() -> None:
    lists = _Lists()
    lists.slices, lists.pod_items = [_slice("gpu-0")], PODS["items"]
    cache = ClusterCache(lambda: lists, "n")
    cache.refresh()
    good = cache.view()
    assert list(good.slices) == [("gpu.nvidia.com", "n", "gpu-0")]
    assert good.pods == pod_index(PODS["items"])
    lists.error = ApiError("unreachable", "refused")
    for _ in range(3):
        cache.refresh()
    assert cache.view() is good
    health = cache.health()
    assert health.up == {"resourceslices": False, "pods": False}
    assert health.failures == {("resourceslices", "unreachable"): 3, ("pods", "unreachable"): 3}
    assert set(health.last_success) == {"resourceslices", "pods"}
    # A good answer replaces it whole: a device the driver no longer publishes goes.
    lists.error, lists.slices = None, [_slice("gpu-1")]
    cache.refresh()
    assert list(cache.view().slices) == [("gpu.nvidia.com", "n", "gpu-1")]
    assert cache.health().up == {"resourceslices": True, "pods": True}


def test_a_configuration_error_is_a_failed_refresh_retried_later() -> None:
    def connect() -> ApiClient:
        raise ApiError("config", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")

    cache = ClusterCache(connect, "n")
    cache.refresh()
    cache.refresh()
    assert cache.health().failures[("resourceslices", "config")] == 2
    assert cache.view().slices == {}
    assert cache.view().pods == PodIndex()


def test_a_device_not_yet_known_refreshes_at_once_at_most_once_per_gap() -> None:
    lists = _Lists()
    cache = ClusterCache(lambda: lists, "n", interval=3600, min_gap=3600, pods=False).start()
    try:
        wait_until(lambda: cache.health().refreshes == 1, timeout=30, what="the first refresh")
        assert cache.want([], wait=30).slices == {}  # nothing missing: no refresh asked for
        assert lists.calls == 1
        lists.slices = [_slice("gpu-0", "gpu-1")]  # the driver publishes the device after the first list
        view = cache.want([("gpu.nvidia.com", "n", "gpu-1")], wait=30)
        assert ("gpu.nvidia.com", "n", "gpu-1") in view.slices
        assert lists.calls == 2
        # Another unknown device within the gap: no new list (the API server is not hammered), no wait.
        view = cache.want([("gpu.nvidia.com", "n", "gpu-9")], wait=30)
        assert ("gpu.nvidia.com", "n", "gpu-9") not in view.slices
        assert lists.calls == 2
    finally:
        cache.stop()


def test_a_poll_waits_for_an_on_demand_refresh_no_longer_than_its_deadline() -> None:
    lists = _Lists()
    cache = ClusterCache(lambda: lists, "n", interval=3600, min_gap=0, pods=False)
    cache.refresh()
    lists.gate.clear()  # the next list hangs
    cache.start()
    try:
        view = cache.want([("gpu.nvidia.com", "n", "gpu-0")], wait=0.05)
        assert view.slices == {}
    finally:
        lists.gate.set()
        cache.stop()


def test_health_families_say_up_failures_and_last_success() -> None:
    health = ApiHealth(
        up={"resourceslices": False, "pods": True},
        failures={("resourceslices", "forbidden"): 2},
        last_success={"pods": 1_790_000_000.0},
    )
    got = {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in health_families(health)}
    assert got == {
        "jaxmon_kubernetes_api_up": [
            ("jaxmon_kubernetes_api_up", {"list": "pods"}, 1.0),
            ("jaxmon_kubernetes_api_up", {"list": "resourceslices"}, 0.0),
        ],
        "jaxmon_kubernetes_api_failures": [
            ("jaxmon_kubernetes_api_failures_total", {"list": "resourceslices", "reason": "forbidden"}, 2.0)
        ],
        "jaxmon_kubernetes_api_last_success_timestamp_seconds": [
            ("jaxmon_kubernetes_api_last_success_timestamp_seconds", {"list": "pods"}, 1_790_000_000.0)
        ],
    }
