"""Pod attribution end to end: the daemon in node mode (as deploy/kubernetes/daemonset-node.yaml runs it) with the
fake libnvidia-ml.so.1 (tests/fakenvml), the fake libtpu service (tests/fake_libtpu.py) and a fake kubelet
(tests/fake_kubelet.py: a gRPC server on a unix socket in a child process, speaking pod-resources v1 with
jaxmon's generated stubs), scraped over HTTP: which series carry which pod, and what a kubelet that goes away,
hangs or refuses does to them and to the scrapes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import Daemon, Samples, StartDaemon, parse_samples, sample
from tests.fake_kubelet import FakeKubelet, container, pod
from tests.fake_libtpu import Chip, FakeLibtpu
from tests.fake_libtpu import Scenario as LibtpuScenario
from tests.fakenvml import Scenario, device, mig_device

POD_LABELS = ("namespace", "pod", "container")
UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(5)]
MINORS = [4, 3, 2, 1, 0]  # /dev/nvidiaN numbers, in another order than NVML's indices
MIG = "MIG-5e0b7a41-2c3d-5f6e-8a9b-0c1d2e3f4a5b"
TPU_IDS = (8, 9)

PODS = [
    pod("team-a", "train-0", container("trainer", {"nvidia.com/gpu": [UUIDS[0]]}), container("log-shipper")),
    pod("team-b", "infer-0", container("server", {"nvidia.com/gpu": [f"nvidia{MINORS[1]}"]})),
    pod("team-c", "notebook-1", container("jupyter", {"nvidia.com/gpu": [f"{UUIDS[2]}::0"]})),
    pod("team-c", "notebook-2", container("jupyter", {"nvidia.com/gpu": [f"{UUIDS[2]}::3"]})),
    pod("team-d", "mig-job", container("worker", {"nvidia.com/mig-1g.10gb": [MIG]})),
    pod("team-e", "tpu-job", container("jax", {"google.com/tpu": ["0", "1"]})),
    pod("team-f", "router", container("nic", {"example.com/nic": ["eth1"]})),
]
# GPU 4 runs in MIG mode with two MIG devices: the first is the mig-job's, the second nobody's.
MIG_DEVICES = [mig_device(4, 0, "1g.18gb", 7, uuid=MIG), mig_device(4, 2, "3g.71gb", 2)]
MIG_POD = {"namespace": "team-d", "pod": "mig-job", "container": "worker"}
# What each device's series carry: NVML index -> labels; GPU 3 nobody's, GPU 4 the MIG device's parent.
GPU_PODS: dict[str, dict[str, str]] = {
    "0": {"namespace": "team-a", "pod": "train-0", "container": "trainer"},
    "1": {"namespace": "team-b", "pod": "infer-0", "container": "server"},
    "2": {"namespace": "team-c", "pod": "notebook-1,notebook-2", "container": "jupyter"},
    "3": {},
    "4": {},
}
TPU_POD = {"namespace": "team-e", "pod": "tpu-job", "container": "jax"}
POD_DEVICES = {
    ("team-a", "train-0", "trainer", "nvidia.com/gpu", UUIDS[0]),
    ("team-b", "infer-0", "server", "nvidia.com/gpu", "nvidia3"),
    ("team-c", "notebook-1", "jupyter", "nvidia.com/gpu", f"{UUIDS[2]}::0"),
    ("team-c", "notebook-2", "jupyter", "nvidia.com/gpu", f"{UUIDS[2]}::3"),
    ("team-d", "mig-job", "worker", "nvidia.com/mig-1g.10gb", MIG),
    ("team-e", "tpu-job", "jax", "google.com/tpu", "0"),
    ("team-e", "tpu-job", "jax", "google.com/tpu", "1"),
}
POLL = 0.3


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet(PODS).start()
    yield fake
    fake.close()


@pytest.fixture
def libtpu() -> Iterator[FakeLibtpu]:
    chips = {dev: Chip(used_bytes=(1 + i) << 30, duty_cycle_pct=40.0 + i) for i, dev in enumerate(TPU_IDS)}
    server = FakeLibtpu(LibtpuScenario(chips=chips)).start()
    yield server
    server.stop()


def node_daemon(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet, libtpu: FakeLibtpu, *extra: str
) -> tuple[Daemon, Scenario]:
    nvml = Scenario(
        tmp_path / "nvml.json",
        [
            device(i, uuid=UUIDS[i], minor_number=MINORS[i], processes=[{"pid": 100 + i, "used": 1 << 30}])
            for i in range(5)
        ],
    )
    nvml.update(4, mig={"current": 1, "pending": 1, "max_devices": 7, "devices": MIG_DEVICES})
    daemon = start_daemon(
        "--node",
        "--poll.interval",
        f"{POLL}s",
        "--collector.nvml",
        "--collector.tpu",
        "--collector.tpu.address",
        libtpu.address,
        "--collector.kubernetes",
        "--collector.kubernetes.socket",
        str(kubelet.socket),
        "--collector.kubernetes.timeout",
        "500ms",
        *extra,
        env=nvml.env(),
    )
    return daemon, nvml


def success(s: Samples, collector: str = "kubernetes") -> float | None:
    return sample(s, "jaxmon_collector_success", collector=collector)


def pod_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in POD_LABELS if k in labels}


def labelled(s: Samples) -> bool:
    return any("pod" in dict(labels) and name != "jaxmon_kubernetes_pod_device_info" for name, labels in s)


def pod_devices(s: Samples) -> set[tuple[str, ...]]:
    keys = (*POD_LABELS, "resource", "device_id")
    return {tuple(dict(lbls)[k] for k in keys) for name, lbls in s if name == "jaxmon_kubernetes_pod_device_info"}


def all_up(s: Samples) -> bool:
    tpu = {
        dict(lbls)["device"] for name, lbls in s if name == "jaxmon_device_source_up" and ("source", "libtpu") in lbls
    }
    return all(success(s, c) == 1 for c in ("kubernetes", "nvml", "tpu")) and tpu == {str(d) for d in TPU_IDS}


def kubelet_log(d: Daemon) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    return [e for e in lines if str(e.get("logger", "")).endswith("kubernetes")]


def test_exactly_the_series_of_held_devices_carry_their_pods(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet, libtpu: FakeLibtpu
) -> None:
    d, nvml = node_daemon(start_daemon, tmp_path, kubelet, libtpu)
    d.wait_for(lambda s: all_up(s) and labelled(s), what="kubelet, NVML and libtpu read")
    # The stubs are committed: the daemon never maps the compiler (about 7 MiB), nor needs it installed.
    assert "_protoc_compiler" not in Path(f"/proc/{d.pid}/maps").read_text()
    nvml.xid(0, 79)
    s = d.wait_for(lambda s: any(name == "jaxmon_device_xid_errors_total" for name, _ in s), what="an Xid counted")
    seen: dict[str, set[str]] = {}
    for name, lbls in s:
        labels = dict(lbls)
        if labels.get("source") == "nvml" and "mig_uuid" in labels:
            # A MIG device's series carry the pod holding that MIG device, by its UUID; its parent GPU's, none.
            assert pod_labels(labels) == (MIG_POD if labels["mig_uuid"] == MIG else {}), (name, labels)
            seen.setdefault(labels["mig_uuid"], set()).add(name)
        elif labels.get("source") == "nvml":
            assert pod_labels(labels) == GPU_PODS[labels["device"]], (name, labels)
            seen.setdefault(labels["device"], set()).add(name)
        elif labels.get("source") == "libtpu":
            assert pod_labels(labels) == TPU_POD, (name, labels)
            seen.setdefault("tpu", set()).add(name)
        elif name != "jaxmon_kubernetes_pod_device_info":
            assert pod_labels(labels) == {}, (name, labels)  # the exporter's own series: nobody's
    # Every NVML family of a held GPU carries its pod, the Xid counter and the process list included.
    assert {
        "jaxmon_device_info",
        "jaxmon_device_source_up",
        "jaxmon_device_memory_used_bytes",
        "jaxmon_device_duty_cycle_ratio",
        "jaxmon_device_power_watts",
        "jaxmon_device_temperature_celsius",
        "jaxmon_device_throttled",
        "jaxmon_device_ecc_errors_total",
        "jaxmon_process_device_memory_bytes",
        "jaxmon_device_xid_errors_total",
    } <= seen["0"]
    assert {"jaxmon_device_memory_used_bytes", "jaxmon_device_duty_cycle_ratio"} <= seen["tpu"]
    mig_families = {
        "jaxmon_mig_device_info",
        "jaxmon_mig_device_memory_total_bytes",
        "jaxmon_mig_device_memory_used_bytes",
    }
    assert seen[MIG] == mig_families and seen[MIG_DEVICES[1]["uuid"]] == mig_families
    assert len(seen["0"]) == len(seen["3"]) + 1  # the Xid counter exists for GPU 0 alone
    assert pod_devices(s) == POD_DEVICES
    # One List per poll, however often the daemon is scraped.
    before, started = kubelet.calls(), time.monotonic()
    for _ in range(30):
        assert d.get("/metrics").status_code == 200
    polls = (time.monotonic() - started) / POLL
    assert kubelet.calls() - before <= polls + 2


def test_a_kubelet_that_goes_away_fails_the_collector_drops_the_labels_after_the_ttl_and_comes_back(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet, libtpu: FakeLibtpu
) -> None:
    d, _ = node_daemon(start_daemon, tmp_path, kubelet, libtpu, "--collector.kubernetes.ttl", "2s")
    d.wait_for(lambda s: all_up(s) and labelled(s), what="labels")
    kubelet.stop()  # the socket goes, as in a kubelet restart
    # The ttl runs from the poll of the last good answer, which may be a poll or more before the stop on a loaded
    # machine (seen: labels gone 1.67 s after the stop). That poll began just before the fake's last call, or a poll
    # before it when the stop cut that call short.
    last = kubelet.last_call()
    s = d.wait_for(lambda s: success(s) == 0, what="the collector failing")
    if time.time() - last < 1.5:
        assert labelled(s), "the last good answer labels devices until the ttl"
    s = d.wait_for(lambda s: not labelled(s), what="labels gone after the ttl", timeout=10)
    assert time.time() - last >= 2.0 - 2 * POLL  # not at the first failure, a poll after the last call
    assert pod_devices(s) == set()
    assert success(s, "nvml") == 1 and sample(s, "jaxmon_device_power_watts", device="0", platform="gpu", source="nvml")
    for _ in range(10):  # scrapes answer at once, from the last snapshot
        started = time.monotonic()
        r = d.get("/metrics", timeout=2)
        assert r.status_code == 200 and time.monotonic() - started < 1.0
        assert not labelled(parse_samples(r.text))
        time.sleep(POLL / 2)
    kubelet.start()  # a new kubelet, a new socket at the same path
    s = d.wait_for(lambda s: success(s) == 1 and labelled(s), what="labels back")
    assert pod_devices(s) == POD_DEVICES
    events = [e["event"] for e in kubelet_log(d)]
    assert events == [
        "kubelet pod-resources unavailable",
        "pod labels dropped: the kubelet has not answered for longer than the ttl",
        "kubelet pod-resources answer again",
    ], "one line per change of state, however many polls failed"
    assert "does not exist" in str(kubelet_log(d)[0]["error"])


def test_a_slow_kubelet_fails_the_collector_without_slowing_scrapes(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet, libtpu: FakeLibtpu
) -> None:
    deadline = ("--collector.kubernetes.timeout", "1s")  # the last flag wins
    d, _ = node_daemon(start_daemon, tmp_path, kubelet, libtpu, "--collector.kubernetes.ttl", "0", *deadline)
    d.wait_for(lambda s: all_up(s) and labelled(s), what="labels")
    kubelet.update(delay_seconds=3)  # answers far past the 1 s deadline
    s = d.wait_for(lambda s: success(s) == 0, what="the collector failing")
    assert not labelled(s) and pod_devices(s) == set()  # ttl 0: no answer, no labels
    assert success(s, "nvml") == 1
    slowest = 0.0
    for _ in range(15):
        started = time.monotonic()
        assert requests.get(d.url + "/metrics", timeout=2).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.1)
    assert slowest < 0.5, f"a scrape took {slowest:.2f}s while the kubelet hung"
    duration = sample(d.scrape(), "jaxmon_collector_duration_seconds", collector="kubernetes")
    assert duration is not None and 0.95 < duration < 2.0  # the deadline, not the kubelet's 3 s
    assert "DEADLINE_EXCEEDED" in str(kubelet_log(d)[0]["error"])
    kubelet.update(delay_seconds=0)
    d.wait_for(lambda s: success(s) == 1 and labelled(s), what="labels back")


def test_a_kubelet_that_refuses_or_left_a_dead_socket_fails_the_collector(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet, libtpu: FakeLibtpu
) -> None:
    d, _ = node_daemon(start_daemon, tmp_path, kubelet, libtpu, "--collector.kubernetes.ttl", "0")
    d.wait_for(lambda s: all_up(s) and labelled(s), what="labels")
    kubelet.update(status="PERMISSION_DENIED")
    s = d.wait_for(lambda s: success(s) == 0, what="the collector failing")
    assert not labelled(s)
    kubelet.update(status=None)
    d.wait_for(lambda s: success(s) == 1 and labelled(s), what="labels back")
    # A kubelet killed outright leaves its socket behind, with nothing listening.
    assert kubelet.proc is not None
    kubelet.proc.kill()
    kubelet.proc.wait()
    assert kubelet.socket.exists()
    s = d.wait_for(lambda s: success(s) == 0, what="the collector failing")
    assert not labelled(s)
    errors = [str(e["error"]) for e in kubelet_log(d) if e["event"] == "kubelet pod-resources unavailable"]
    assert [e.split(":")[0] for e in errors] == ["PERMISSION_DENIED", "UNAVAILABLE"]


def test_auto_runs_where_the_socket_is_and_stays_off_elsewhere(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet
) -> None:
    fast = ("--node", "--poll.interval", f"{POLL}s")
    here = start_daemon(*fast, "--collector.kubernetes.socket", str(kubelet.socket))
    s = here.wait_for(lambda s: success(s) == 1, what="the kubernetes collector running")
    assert pod_devices(s) == POD_DEVICES
    elsewhere = start_daemon(*fast, "--collector.kubernetes.socket", str(tmp_path / "missing.sock"))
    s = elsewhere.scrape()
    assert success(s) is None and pod_devices(s) == set()
    (line,) = [json.loads(x) for x in elsewhere.log().splitlines() if '"collectors"' in x]
    assert "no kubelet pod-resources socket" in line["configured_but_off"]["kubernetes"]


def test_a_sidecars_jax_device_carries_the_owners_of_its_gpu_as_the_nvml_series_do(
    start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet
) -> None:
    """One transform for every collector: a daemon whose JAX device (a replayed gpu:0, the JAX device source that
    can be a GPU here) the nvml collector matches to the fake NVML's one GPU (device_match="only_gpu") labels the
    JAX device's series (memory, its jaxmon_device_info row) with the pod holding that GPU, as the GPU's own."""
    replay = tmp_path / "replay.json"
    stats = {"bytes_in_use": 1 << 30, "peak_bytes_in_use": 2 << 30, "bytes_limit": 64 << 30, "num_allocs": 3}
    replay.write_text(
        json.dumps({"devices": [{"id": 0, "platform": "gpu", "device_kind": "NVIDIA H200", "memory_stats": stats}]}),
        encoding="utf-8",
    )
    nvml = Scenario(tmp_path / "nvml.json", [device(0, uuid=UUIDS[0], minor_number=0)])
    d = start_daemon(
        "--replay",
        str(replay),
        "--poll.interval",
        f"{POLL}s",
        "--collector.nvml",
        "--collector.kubernetes",
        "--collector.kubernetes.socket",
        str(kubelet.socket),
        env=nvml.env(),
    )
    jax = {"device": "0", "platform": "gpu"}
    s = d.wait_for(
        lambda s: labelled(s) and sample(s, "jaxmon_memory_bytes_in_use", **jax, **GPU_PODS["0"]) is not None,
        what="the JAX device's series labelled",
    )
    row = {**jax, "uuid": UUIDS[0], "device_match": "only_gpu", "source": "nvml"}
    assert [pod_labels(dict(lbls)) for name, lbls in s if name == "jaxmon_device_info" and row.items() <= lbls] == [
        GPU_PODS["0"]
    ]
    own = [(name, dict(lbls)) for name, lbls in s if ("device", "0") in lbls and ("source", "nvml") not in lbls]
    assert {name for name, _ in own} >= {
        "jaxmon_memory_bytes_in_use",
        "jaxmon_memory_limit_bytes",
        "jaxmon_device_info",
    }
    for name, labels in own:
        assert pod_labels(labels) == GPU_PODS["0"], (name, labels)
