"""The kubernetes collector without a kubelet: its flags, when `auto` runs it, a missing socket, its own family, and
the labels the nvml and tpu collectors' series take from it through the owner transform (or, without it, do not
take).

Everything that calls a kubelet goes through the fake kubelet, a gRPC server on a unix socket in a child process:
tests/e2e/test_daemon_kubernetes.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from structlog.testing import capture_logs

from jaxmon.collectors.base import AnyCollector, Context, standalone_context
from jaxmon.collectors.kubernetes import KubernetesCollector, KubernetesOptions, KubernetesState
from jaxmon.collectors.nvml import DeviceMatch, NvmlCollector, NvmlOptions, NvmlState
from jaxmon.collectors.tpu import TpuCollector, TpuDevice, TpuOptions, TpuState
from jaxmon.compose import default_settings, load_settings
from jaxmon.exchange import Owner
from jaxmon.ownership.attribution import attribute
from jaxmon.ownership.owners import OwnerTransform
from jaxmon.settings import SettingsError
from jaxmon.snapshot import Snapshot
from jaxmon.sources.kubelet import Allocation
from jaxmon.sources.node import NodeSource
from jaxmon.sources.nvml import GpuReading, Process

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(3)]
HELD = (
    Allocation("team-a", "train", "trainer", "nvidia.com/gpu", (UUIDS[0],)),
    Allocation("team-b", "serve", "server", "nvidia.com/gpu", ("nvidia6",)),
    Allocation("team-c", "job", "jax", "google.com/tpu", ("0", "1")),
    Allocation("team-d", "other", "x", "example.com/nic", ("eth1",)),
)


def options(*argv: str) -> KubernetesOptions:
    found = load_settings(list(argv)).collector_options("kubernetes")
    assert isinstance(found, KubernetesOptions)
    return found


def context() -> Context:
    return standalone_context(NodeSource())


def samples(families: list[Metric]) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value) for fam in families for s in fam.samples]


def test_auto_by_default_with_the_kubelets_socket_and_lists_given_comma_separated() -> None:
    default = default_settings().collector_options("kubernetes")
    assert isinstance(default, KubernetesOptions) and default.enabled == "auto"
    assert str(default.socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert (default.timeout, default.ttl) == (2.0, 15.0)
    assert default.gpu_resources == ("nvidia.com/gpu", "nvidia.com/mig-*")
    assert default.tpu_resources == ("google.com/tpu",)
    given = options(
        "--collector.kubernetes.socket=/k/kubelet.sock",
        "--collector.kubernetes.timeout=500ms",
        "--collector.kubernetes.ttl=0",
        "--collector.kubernetes.gpu-resources=nvidia.com/gpu, amd.com/gpu",
    )
    assert (str(given.socket), given.timeout, given.ttl) == ("/k/kubelet.sock", 0.5, 0.0)
    assert given.gpu_resources == ("nvidia.com/gpu", "amd.com/gpu")
    from_env = load_settings([], environ={"JAXMON_COLLECTOR__KUBERNETES__TPU_RESOURCES": "google.com/tpu,x/y"})
    assert from_env.collector_options("kubernetes").tpu_resources == ("google.com/tpu", "x/y")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--collector.kubernetes.timeout=0", "--collector.kubernetes.timeout: must be longer than 0s"),
        ("--collector.kubernetes.timeout=2m", "--collector.kubernetes.timeout: must be at most 1m"),
        ("--collector.kubernetes.ttl=-1s", "--collector.kubernetes.ttl"),
    ],
)
def test_bad_durations_are_refused_naming_the_flag(flag: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        options(flag)


def test_auto_runs_only_where_the_socket_exists(tmp_path: Path) -> None:
    missing = options(f"--collector.kubernetes.socket={tmp_path / 'kubelet.sock'}")
    reason = KubernetesCollector.unavailable(missing, context())
    assert reason is not None and "does not exist" in reason
    file = tmp_path / "file"
    file.write_text("")
    reason = KubernetesCollector.unavailable(options(f"--collector.kubernetes.socket={file}"), context())
    assert reason is not None and "is not a socket" in reason
    path = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as listener:  # bound, not listening or connected: no peer is involved
        listener.bind(str(path))
        assert KubernetesCollector.unavailable(missing, context()) is None
    explicit = options("--collector.kubernetes", f"--collector.kubernetes.socket={tmp_path / 'nothing'}")
    assert KubernetesCollector.unavailable(explicit, context()) is None


def test_a_missing_socket_fails_every_poll_with_no_labels_and_one_log_line(tmp_path: Path) -> None:
    collector = KubernetesCollector(
        options("--collector.kubernetes", f"--collector.kubernetes.socket={tmp_path / 'kubelet.sock'}"), context()
    )
    with capture_logs() as logs:
        updates = [collector.update() for _ in range(4)]
    assert [u.success for u in updates] == [False] * 4
    state = updates[-1].state
    assert state.devices == () and state.taken is None and "does not exist" in (state.error or "")
    assert state.attribution.gpu(UUIDS[0], 0) == {}
    assert [e["event"] for e in logs] == ["kubelet pod-resources unavailable"]
    assert [fam.samples for fam in collector.families(Snapshot(), state)] == [[]]
    collector.stop()


def test_its_own_family_lists_each_device_of_each_container() -> None:
    collector = KubernetesCollector(options(), context())
    kept = HELD[:3]
    state = KubernetesState(devices=kept, attribution=attribute(kept), taken=0.0)
    got = samples(list(collector.families(Snapshot(), state)))
    assert [(name, labels["pod"], labels["resource"], labels["device_id"]) for name, labels, _ in got] == [
        ("jaxmon_kubernetes_pod_device_info", "train", "nvidia.com/gpu", UUIDS[0]),
        ("jaxmon_kubernetes_pod_device_info", "serve", "nvidia.com/gpu", "nvidia6"),
        ("jaxmon_kubernetes_pod_device_info", "job", "google.com/tpu", "0"),
        ("jaxmon_kubernetes_pod_device_info", "job", "google.com/tpu", "1"),
    ]
    assert set(got[0][1]) == {"namespace", "pod", "container", "resource", "device_id"}
    assert {value for _, _, value in got} == {1.0}


def nvml_state() -> NvmlState:
    def gpu(index: int, **extra: object) -> GpuReading:
        return GpuReading(
            index=index,
            name="NVIDIA H100 80GB HBM3",
            uuid=UUIDS[index],
            pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
            minor_number=7 - index,
            memory_total_bytes=80 << 30,
            memory_used_bytes=1 << 30,
            duty_cycle_ratio=0.5,
            power_watts=300.0,
            clocks_event_reasons=0x4,
            ecc_corrected_total=0,
            ecc_uncorrected_total=0,
            processes=(Process(pid=4242, used_bytes=1 << 30),),
            **extra,  # type: ignore[arg-type]
        )

    return NvmlState(
        gpus=(gpu(0), gpu(1), gpu(2, error="NVML_ERROR_GPU_IS_LOST")),
        xid={(0, 79): 1, (2, 48): 2},
        match=DeviceMatch(),
    )


def rendered(collector: AnyCollector, state: object, pods: KubernetesState | None) -> list[Metric]:
    """`collector`'s families for `state`, through the owner transform over the offers of a snapshot holding `state`
    and the kubernetes collector's `pods`, wired as the composition root wires them."""
    exchange = collector.ctx.exchange
    states = {collector.name: state} if pods is None else {collector.name: state, "kubernetes": pods}
    snap = Snapshot(source="node", states=states)
    for cls in (type(collector), KubernetesCollector):
        for channel, read in cls.offers.items():
            exchange.offer(channel, cls.name, read)
    return OwnerTransform(exchange)(snap, list(collector.families(snap, state)))


def nvml_samples(pods: KubernetesState | None) -> list[tuple[str, dict[str, str], float]]:
    return samples(rendered(NvmlCollector(NvmlOptions(), context()), nvml_state(), pods))


def test_nvml_series_carry_the_pod_of_their_gpu_and_render_as_before_without_one() -> None:
    before = nvml_samples(None)
    assert before and not [labels for _, labels, _ in before if {"pod", "namespace", "container"} & set(labels)]
    # A kubelet that assigned none of these GPUs changes nothing.
    nobody = (HELD[3],)
    assert nvml_samples(KubernetesState(devices=nobody, attribution=attribute(nobody))) == before
    held = nvml_samples(KubernetesState(devices=HELD, attribution=attribute(HELD)))
    assert len(held) == len(before)
    for (name, labels, value), (old_name, old_labels, old_value) in zip(held, before, strict=True):
        assert (name, value) == (old_name, old_value)
        extra = {k: v for k, v in labels.items() if k not in old_labels}
        assert {k: v for k, v in labels.items() if k in old_labels} == old_labels
        if old_labels["device"] == "0":  # by UUID: every family, the xid counter and the process too
            assert extra == {"namespace": "team-a", "pod": "train", "container": "trainer"}, name
        elif old_labels["device"] == "1":  # by its minor number, 6 (NVML index 1)
            assert extra == {"namespace": "team-b", "pod": "serve", "container": "server"}, name
        else:  # GPU 2 is lost, and still known by its UUID: nobody holds it
            assert extra == {}, name
    families = {name for name, labels, _ in held if labels.get("pod") == "train"}
    assert {
        "jaxmon_device_source_up",
        "jaxmon_device_info",
        "jaxmon_device_memory_used_bytes",
        "jaxmon_device_power_watts",
        "jaxmon_device_throttled",
        "jaxmon_device_ecc_errors_total",
        "jaxmon_device_xid_errors_total",
        "jaxmon_process_device_memory_bytes",
    } <= families


def tpu_samples(pods: KubernetesState | None) -> list[tuple[str, dict[str, str], float]]:
    state = TpuState(devices=(TpuDevice(8, True, 16e9, 1e9, 0.5), TpuDevice(9, False)))
    return samples(rendered(TpuCollector(TpuOptions(), context()), state, pods))


def test_tpu_series_carry_the_one_container_holding_chips_and_render_as_before_without_it() -> None:
    before = tpu_samples(None)
    assert before and not [labels for _, labels, _ in before if "pod" in labels]
    held = tpu_samples(KubernetesState(devices=HELD, attribution=attribute(HELD)))
    assert [(n, v) for n, _, v in held] == [(n, v) for n, _, v in before]
    for _, labels, _ in held:
        assert (labels["namespace"], labels["pod"], labels["container"]) == ("team-c", "job", "jax")
    two = (*HELD, Allocation("team-e", "job2", "jax", "google.com/tpu", ("2",)))
    assert tpu_samples(KubernetesState(devices=two, attribution=attribute(two))) == before


def test_the_api_server_options_default_to_the_pods_service_account_and_a_minute() -> None:
    from jaxmon.collectors.kubernetes import SERVICE_ACCOUNT

    default = default_settings().collector_options("kubernetes")
    assert isinstance(default, KubernetesOptions)
    assert (default.resourceslice_interval, default.api_timeout, default.node_name) == (60.0, 5.0, "")
    assert str(default.service_account) == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert default.service_account == SERVICE_ACCOUNT  # written once, as the option's default
    given = options(
        "--collector.kubernetes.resourceslice-interval=2m",
        "--collector.kubernetes.node-name=node-a",
        "--collector.kubernetes.service-account=/sa",
    )
    assert (given.resourceslice_interval, given.node_name, str(given.service_account)) == (120.0, "node-a", "/sa")
    with pytest.raises(SettingsError, match="resourceslice-interval: must be longer than 0s"):
        options("--collector.kubernetes.resourceslice-interval=0")


def test_dra_claims_are_listed_with_their_claim_and_the_api_servers_health_beside_them() -> None:
    from jaxmon.ownership.dra import resolve
    from jaxmon.sources.cluster_cache import ApiHealth
    from jaxmon.sources.kubelet import ClaimedDevice
    from jaxmon.sources.kubernetes_api import index_slices

    slices = index_slices(
        [
            {
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "pool": {"name": "node-a"},
                    "devices": [{"name": "gpu-1", "attributes": {"uuid": {"string": UUIDS[1]}}}],
                }
            }
        ]
    )
    claimed = [
        ClaimedDevice("team-a", "train", "trainer", "gpus", "team-a", "gpu.nvidia.com", "node-a", "gpu-1"),
        ClaimedDevice("team-b", "late", "main", "gpus", "team-b", "gpu.nvidia.com", "node-a", "gpu-9"),
    ]
    state = KubernetesState(
        devices=HELD[:1],
        attribution=attribute(HELD[:1]),
        taken=0.0,
        dra=resolve(slices, claimed),
        api=ApiHealth(up={"resourceslices": True}, failures={("resourceslices", "timeout"): 1}),
        dra_problems={"not_in_slices": 1},
    )
    got = samples(list(KubernetesCollector(options(), context()).families(Snapshot(), state)))
    info = [labels for name, labels, _ in got if name == "jaxmon_kubernetes_pod_device_info"]
    assert info == [
        {"namespace": "team-a", "pod": "train", "container": "trainer", "resource": "nvidia.com/gpu",
         "device_id": UUIDS[0]},
        {"namespace": "team-a", "pod": "train", "container": "trainer", "resource": "gpu.nvidia.com",
         "device_id": "node-a/gpu-1", "claim": "gpus"},
        # Listed though no slice names it (as the kubelet assigned it), and counted as a problem.
        {"namespace": "team-b", "pod": "late", "container": "main", "resource": "gpu.nvidia.com",
         "device_id": "node-a/gpu-9", "claim": "gpus"},
    ]  # fmt: skip
    rest = [(name, labels, value) for name, labels, value in got if name != "jaxmon_kubernetes_pod_device_info"]
    assert rest == [
        ("jaxmon_kubernetes_api_up", {"list": "resourceslices"}, 1.0),
        ("jaxmon_kubernetes_api_failures_total", {"list": "resourceslices", "reason": "timeout"}, 1.0),
        ("jaxmon_kubernetes_dra_problems_total", {"reason": "no_identity"}, 0.0),
        ("jaxmon_kubernetes_dra_problems_total", {"reason": "not_in_slices"}, 1.0),
    ]
    # The resolution is the state's, for the owners transform: the claimed GPU by its UUID.
    assert state.dra is not None
    assert state.dra.holders(("uuid", UUIDS[1].lower())) == {Owner("team-a", "train", "trainer")}
