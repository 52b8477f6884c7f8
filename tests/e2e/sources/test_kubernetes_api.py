"""DRA end to end at the sources: the fake kubelet (tests/fake_kubelet.py, gRPC on a unix socket) lists claims beside
device-plugin devices, the fake API server (tests/fake_apiserver.py, HTTPS on loopback with a test CA) publishes
the node's ResourceSlices and pods, and jaxmon's client, cache and resolution (jaxmon.sources.kubernetes_api,
jaxmon.ownership.dra) turn them into the holders of each GPU, MIG device and TPU chip: the token checked, TLS verified,
pages followed, an outage that keeps every known mapping, and a claimed device no slice names counted as a problem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxmon.ownership.dra import NOT_IN_SLICES, ProblemCounter, resolve
from jaxmon.sources.cluster_cache import ClusterCache
from jaxmon.sources.kubelet import Allocation, ClaimedDevice, PodResourcesClient
from jaxmon.sources.kubernetes_api import ApiClient, ApiError, InCluster
from tests.fake_apiserver import FakeApiServer, nvidia_slice, pod_item, tpu_slice
from tests.fake_kubelet import FakeKubelet, claim, claimed, container, pod
from tests.helpers import wait_until
from tests.tls_helpers import make_certs
from tests.unit.test_dra import claim_holder

NODE = "node-a"
UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(4)]
MIG = "MIG-5e0b7a41-2c3d-5f6e-8a9b-0c1d2e3f4a5b"
SLICES = [
    nvidia_slice(NODE, [(UUIDS[0], 0), (UUIDS[1], 1), (UUIDS[2], 2)], migs=[(MIG, 2, "1g.10gb")]),
    tpu_slice(NODE, 4),
    nvidia_slice("node-b", [(UUIDS[3], 0)]),  # another node's: the field selector leaves it out
]
PODS = [
    pod_item(NODE, "team-a", "train-0", "uid-train", {"trainer": "containerd://aaa", "log": "containerd://bbb"}),
    pod_item(NODE, "team-b", "notebook", "uid-nb", {"jupyter": "containerd://ccc"}),
    pod_item("node-b", "team-z", "elsewhere", "uid-z", {"x": "containerd://zzz"}),
]
# team-a's trainer holds GPU 0 by the device plugin and GPU 1 by DRA (a pod that holds both); the notebook holds
# a MIG device and a TPU chip by DRA only.
KUBELET_PODS = [
    pod(
        "team-a",
        "train-0",
        container(
            "trainer",
            {"nvidia.com/gpu": [UUIDS[0]]},
            [claim("train-gpus", "team-a", claimed("gpu.nvidia.com", NODE, "gpu-1"))],
        ),
        container("log"),
    ),
    pod(
        "team-b",
        "notebook",
        container(
            "jupyter",
            claims=[
                claim("mig", "team-b", claimed("gpu.nvidia.com", NODE, "gpu-2-mig-1g.10gb-0", share_id="s1")),
                claim("tpu", "team-b", claimed("tpu.google.com", NODE, "accel3")),
            ],
        ),
    ),
]


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer(SLICES, PODS).start()
    yield fake
    fake.close()


def _client(server: FakeApiServer, **kw: float) -> ApiClient:
    return ApiClient(InCluster.from_env(server.env, server.account), **kw)


def test_the_lists_need_the_token_follow_pages_and_keep_to_the_node(server: FakeApiServer, tmp_path: Path) -> None:
    client = _client(server)
    server.update(page_size=1)
    slices = client.resource_slices(NODE)
    assert [s["spec"]["driver"] for s in slices] == ["gpu.nvidia.com", "tpu.google.com"]
    assert [p["metadata"]["name"] for p in client.pods(NODE)] == ["train-0", "notebook"]
    calls = server.calls()
    assert calls[0] == "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a&limit=500"
    assert calls[1].endswith("&limit=500&continue=1")  # the second page
    assert len(calls) == 4

    # A token the server refuses is read again from the file once, then named.
    server.update(token="rotated")
    with pytest.raises(ApiError, match="401") as err:
        client.pods(NODE)
    assert err.value.code == "unauthorized"
    # The kubelet rotates the projected token: the next list reads it, with no restart.
    (server.account / "token.new").write_text("rotated")
    (server.account / "token.new").replace(server.account / "token")
    assert len(client.pods(NODE)) == 2

    # A server whose certificate the service account's CA did not sign is refused.
    other = make_certs(tmp_path)
    account = tmp_path / "account"
    account.mkdir()
    (account / "token").write_text("rotated")
    (account / "ca.crt").write_bytes(other.server_ca.read_bytes())
    with pytest.raises(ApiError) as err:
        ApiClient(InCluster.from_env(server.env, account)).pods(NODE)
    assert err.value.code == "tls"


def test_claims_from_the_kubelet_resolve_through_the_slices_to_their_devices(server: FakeApiServer) -> None:
    kubelet = FakeKubelet(KUBELET_PODS).start()
    try:
        listed = PodResourcesClient(kubelet.socket, timeout=10).list_all()
    finally:
        kubelet.close()
    assert listed.allocations == (Allocation("team-a", "train-0", "trainer", "nvidia.com/gpu", (UUIDS[0],)),)
    assert [(c.pod, c.container, c.claim, c.driver, c.device, c.share_id) for c in listed.claimed] == [
        ("train-0", "trainer", "train-gpus", "gpu.nvidia.com", "gpu-1", None),
        ("notebook", "jupyter", "mig", "gpu.nvidia.com", "gpu-2-mig-1g.10gb-0", "s1"),
        ("notebook", "jupyter", "tpu", "tpu.google.com", "accel3", None),
    ]
    assert listed.claimed[0].cdi_devices == ("k8s.gpu.nvidia.com/claim=gpu-1",)

    cache = ClusterCache(lambda: _client(server), NODE)
    cache.refresh()
    got = resolve(cache.view().slices, listed.claimed)
    assert got.devices == {
        ("uuid", UUIDS[1].lower()): {claim_holder("team-a", "train-0", "trainer", "train-gpus")},
        ("mig", MIG.lower()): {claim_holder("team-b", "notebook", "jupyter", "mig")},
        ("tpu", "3"): {claim_holder("team-b", "notebook", "jupyter", "tpu")},
    }
    assert got.unresolved == ()
    pods = cache.view().pods
    assert pods.pods == {"uid-train": ("team-a", "train-0"), "uid-nb": ("team-b", "notebook")}
    assert pods.containers["ccc"] == ("uid-nb", "jupyter")


def test_an_api_server_outage_keeps_every_known_mapping_and_is_counted(server: FakeApiServer) -> None:
    # The period shortened to 50 ms: each refresh in the outage is one a 60 s period would make in a minute.
    cache = ClusterCache(lambda: _client(server, timeout=2), NODE, interval=0.05).start()
    try:
        wait_until(lambda: cache.health().up.get("pods") is True, timeout=30, what="the first lists")
        known = cache.view()
        assert len(known.slices) == 8  # 3 GPUs, 1 MIG device, 4 TPU chips of node-a
        server.update(status=503)
        wait_until(
            lambda: cache.health().failures.get(("resourceslices", "http_503"), 0) >= 5,
            timeout=30,
            what="five refreshes answered 503",
        )
        server.stop()  # then nothing listens at all
        wait_until(
            lambda: cache.health().failures.get(("resourceslices", "unreachable"), 0) >= 5,
            timeout=30,
            what="five refreshes refused",
        )
        assert cache.view() is known
        assert cache.health().up == {"resourceslices": False, "pods": False}
        server.update(status=None, slices=SLICES[:1])  # back, with the TPU driver's slice gone
        server.start()
        wait_until(lambda: all(cache.health().up.values()), timeout=30, what="the lists again")
        assert len(cache.view().slices) == 4
    finally:
        cache.stop()


def test_a_claimed_device_no_slice_names_is_a_problem_and_costs_the_api_server_one_list(
    server: FakeApiServer,
) -> None:
    cache = ClusterCache(lambda: _client(server), NODE, interval=3600, min_gap=0).start()
    counter = ProblemCounter()

    def slice_lists() -> int:
        return sum(c.startswith("/apis/resource.k8s.io/") for c in server.calls())

    try:
        wait_until(lambda: cache.health().refreshes >= 1, timeout=30, what="the first lists")
        assert slice_lists() == 1
        late = ClaimedDevice("team-c", "new", "main", "gpus", "team-c", "gpu.nvidia.com", NODE, "gpu-3")
        # The driver has not published gpu-3: the poll asks for a refresh, which does not find it either.
        view = cache.want([("gpu.nvidia.com", NODE, "gpu-3")], wait=30)
        assert slice_lists() == 2
        got = resolve(view.slices, [late])
        counter.observe(got)
        assert got.devices == {} and [u.reason for u in got.unresolved] == [NOT_IN_SLICES]
        assert counter.counts == {NOT_IN_SLICES: 1}
        # Asked again at the next polls: no more lists than the period's (the API server is not hammered).
        for _ in range(3):
            counter.observe(resolve(cache.want([("gpu.nvidia.com", NODE, "gpu-3")], wait=30).slices, [late]))
        assert slice_lists() == 2
        assert counter.counts == {NOT_IN_SLICES: 1}  # one problem, not one per poll
        # Published, with another device a new pod claims: that one refreshes the slices at once, not after the
        # period, and both resolve.
        server.update(slices=[nvidia_slice(NODE, [(UUIDS[0], 0), (UUIDS[3], 3), (UUIDS[2], 4)], generation=2)])
        newer = ClaimedDevice("team-d", "newer", "main", "gpus", "team-d", "gpu.nvidia.com", NODE, "gpu-4")
        view = cache.want([("gpu.nvidia.com", NODE, "gpu-3"), ("gpu.nvidia.com", NODE, "gpu-4")], wait=30)
        assert slice_lists() == 3
        got = resolve(view.slices, [late, newer])
        counter.observe(got)
        assert got.devices == {
            ("uuid", UUIDS[3].lower()): {claim_holder("team-c", "new", "main", "gpus")},
            ("uuid", UUIDS[2].lower()): {claim_holder("team-d", "newer", "main", "gpus")},
        }
        assert counter.counts == {NOT_IN_SLICES: 1}
    finally:
        cache.stop()


def test_a_process_of_a_pod_newer_than_the_list_asks_for_one_pods_list_at_once(server: FakeApiServer) -> None:
    cache = ClusterCache(lambda: _client(server), NODE, interval=3600, min_gap=0).start()

    def pod_lists() -> int:
        return sum(c.startswith("/api/v1/pods") for c in server.calls())

    try:
        wait_until(lambda: cache.health().refreshes >= 1, timeout=30, what="the first lists")
        assert pod_lists() == 1 and "uid-new" not in cache.view().pods.pods
        # Known pods ask for nothing.
        asked = cache._last_demand
        cache.want_pods(["uid-train", "uid-nb"])
        assert cache._last_demand == asked and cache.health().refreshes == 1
        # A pod scheduled since the list: a process of it asks for a list, not waiting for the hour's period.
        server.update(pods=[*PODS, pod_item(NODE, "team-c", "new", "uid-new", {"main": "containerd://ddd"})])
        cache.want_pods(["uid-train", "uid-new"])
        wait_until(lambda: "uid-new" in cache.view().pods.pods, timeout=30, what="the new pod listed")
        assert cache.view().pods.pods["uid-new"] == ("team-c", "new")
        assert pod_lists() == 2
        # A UID no list names (a pod of another node, or deleted): one list for it, then none at each poll.
        cache.want_pods(["uid-gone"])
        wait_until(lambda: pod_lists() == 3, timeout=30, what="one list for the unknown pod")
        wait_until(lambda: cache.health().refreshes == 3, timeout=30, what="that refresh done")
        asked = cache._last_demand
        for _ in range(3):
            cache.want_pods(["uid-gone"])
        assert cache._last_demand == asked  # no refresh asked for (want_pods does not wait for one)
        assert cache.health().refreshes == 3 and pod_lists() == 3
    finally:
        cache.stop()
