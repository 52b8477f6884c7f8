"""The owner transform (jaxmon.ownership.owners) on hand-made states of the real collectors, wired as the composition
root wires them: one step that labels every series of an owned device or process, whatever collector made it (the
JAX device series of a sidecar whose device NVML matched to a GPU included), once per rendered snapshot.

The kubelet's rules themselves (ids, shared GPUs, the TPU holder) are tests/unit/test_attribution.py's; the
daemon with the fake NVML and the fake kubelet is tests/e2e/test_daemon_kubernetes.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from jaxmon.allocator import memory_numbers
from jaxmon.collectors.base import AnyCollector, standalone_context
from jaxmon.collectors.kubernetes import KubernetesCollector, KubernetesOptions, KubernetesState
from jaxmon.collectors.memory import MemoryCollector, MemoryOptions, MemoryState
from jaxmon.collectors.nvml import DeviceMatch, NvmlCollector, NvmlOptions, NvmlState
from jaxmon.device_readings import DeviceInfo, MemoryReading
from jaxmon.exchange import GPU_UUID, OWNERS, Owner, Owners
from jaxmon.exposition import Exposition
from jaxmon.ownership.attribution import attribute
from jaxmon.ownership.owners import OwnerTransform
from jaxmon.snapshot import Snapshot
from jaxmon.sources.kubelet import Allocation
from jaxmon.sources.nvml import GpuReading, Process
from jaxmon.sources.replay import ReplaySource
from tests.snapshots import FIXTURES

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(2)]
TRAIN = {"namespace": "team-a", "pod": "train-0", "container": "trainer"}
OWNER_LABELS = ("namespace", "pod", "container")
STATS = {"bytes_in_use": 1 << 30, "peak_bytes_in_use": 2 << 30, "bytes_limit": 64 << 30, "num_allocs": 3}


def gpu(index: int, pids: Sequence[int] = ()) -> GpuReading:
    return GpuReading(
        index=index,
        name="NVIDIA H200",
        uuid=UUIDS[index],
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        minor_number=index,
        memory_total_bytes=141 << 30,
        memory_used_bytes=(10 + index) << 30,
        power_watts=300.0,
        processes=tuple(Process(pid=pid, used_bytes=(1 + n) << 30) for n, pid in enumerate(pids)),
    )


class Daemon:
    """A sidecar's memory collector on replayed JAX GPU devices, the nvml and kubernetes collectors, and the
    exposition with the owner transform, over hand-made states."""

    def __init__(self, devices: Sequence[DeviceInfo], workload: str | None = None) -> None:
        self.devices = tuple(devices)
        self.workload = workload
        ctx = standalone_context(ReplaySource(FIXTURES / "shapes.json"), devices)
        self.exchange = ctx.exchange
        self.collectors: list[AnyCollector] = [
            MemoryCollector(MemoryOptions(), ctx),
            NvmlCollector(NvmlOptions(), ctx),
            KubernetesCollector(KubernetesOptions(), ctx),
        ]
        for c in self.collectors:  # as jaxmon.compose.build_runtime does
            for channel, read in c.offers.items():
                self.exchange.offer(channel, c.name, read)
        self.transform = OwnerTransform(self.exchange)

    def snapshot(self, nvml: NvmlState, held: Sequence[Allocation] = (), version: int = 1) -> Snapshot:
        memory = MemoryState({d.key: MemoryReading(memory_numbers(STATS)) for d in self.devices})
        states: dict[str, object] = {"memory": memory, "nvml": nvml}
        if held:
            states["kubernetes"] = KubernetesState(devices=tuple(held), attribution=attribute(held), taken=0.0)
        return Snapshot(devices=self.devices, source="replay", workload=self.workload, states=states, version=version)

    def scrape(self, snap: Snapshot) -> list[tuple[str, dict[str, str]]]:
        text = Exposition(lambda: snap, self.collectors, self.transform).render(want_gzip=False).decode()
        return [(s.name, dict(s.labels)) for fam in text_string_to_metric_families(text) for s in fam.samples]


def owners_of(labels: dict[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in OWNER_LABELS if k in labels}


JAX_GPU0 = DeviceInfo(0, "gpu", "NVIDIA H200")
HELD = (Allocation("team-a", "train-0", "trainer", "nvidia.com/gpu", (UUIDS[0],)),)


def test_a_sidecars_jax_device_matched_to_a_gpu_carries_the_owners_of_the_gpus_nvml_series() -> None:
    daemon = Daemon([JAX_GPU0])
    got = daemon.scrape(daemon.snapshot(NvmlState(gpus=(gpu(0),), match=DeviceMatch("only_gpu", {0: 0})), HELD))
    nvml = [(n, labels) for n, labels in got if labels.get("source") == "nvml"]
    jax = [(n, labels) for n, labels in got if labels.get("device") == "0" and labels.get("source") != "nvml"]
    assert {n for n, _ in jax} >= {"jaxmon_memory_bytes_in_use", "jaxmon_memory_limit_bytes", "jaxmon_device_info"}
    assert nvml and all(owners_of(labels) == TRAIN for _, labels in nvml), nvml
    # The JAX device's own series (memory, its jaxmon_device_info row) are the same GPU's: the same owners.
    assert all(owners_of(labels) == TRAIN for _, labels in jax), jax
    # Nothing else is anybody's: the exporter's own series, and the kubelet's list keeps its own labels.
    for name, labels in got:
        if "device" not in labels and name != "jaxmon_kubernetes_pod_device_info":
            assert owners_of(labels) == {}, (name, labels)


def test_a_jax_device_matched_by_nvml_index_alone_or_a_spooled_workloads_device_carries_no_owner() -> None:
    daemon = Daemon([JAX_GPU0])
    # device_match="nvml_index": the GPU's device label is NVML's index, which says nothing of which JAX device.
    got = daemon.scrape(daemon.snapshot(NvmlState(gpus=(gpu(0),), match=DeviceMatch()), HELD))
    assert next(owners_of(labels) for _, labels in got if labels.get("source") == "nvml") == TRAIN
    jax = [labels for _, labels in got if "device" in labels and labels.get("source") != "nvml"]
    assert jax and [labels for labels in jax if owners_of(labels)] == []
    # An embedded daemon's own devices carry its workload; another workload's device 0 is numbered by its process.
    embedded = Daemon([JAX_GPU0], workload="trainer")
    index = embedded.transform.index(
        embedded.snapshot(NvmlState(gpus=(gpu(0),), match=DeviceMatch("only_gpu", {0: 0})), HELD)
    )
    assert index is not None
    assert index.labels_of({"device": "0", "platform": "gpu", "workload": "trainer"}) == TRAIN
    assert index.labels_of({"device": "0", "platform": "gpu", "workload": "other"}) == {}
    assert index.labels_of({"device": "0", "platform": "gpu", "source": "spool", "workload": "other"}) == {}
    # A series that names its pod already (a workload's scheduler labels) is left as it is.
    assert index.relabel({"device": "0", "platform": "gpu", "workload": "trainer", "pod": "mine"}) is None
    assert index.relabel({"device": "0", "platform": "gpu", "workload": "trainer"}) == {
        "device": "0",
        "platform": "gpu",
        "workload": "trainer",
        **TRAIN,
    }


def test_a_process_with_an_owner_of_its_own_carries_it_and_the_others_keep_their_gpus() -> None:
    """The pid -> owner path: a literal map as the cgroup source will offer it, beside the kubelet's."""
    daemon = Daemon([])
    shared = (
        Allocation("team-c", "notebook-1", "jupyter", "nvidia.com/gpu", (f"{UUIDS[1]}::0",)),
        Allocation("team-c", "notebook-2", "jupyter", "nvidia.com/gpu", (f"{UUIDS[1]}::3",)),
    )
    notebook = Owner("team-c", "notebook-2", "jupyter")
    daemon.exchange.constant(OWNERS, Owners(pids={201: frozenset({notebook})}))
    nvml = NvmlState(gpus=(gpu(0, pids=(100,)), gpu(1, pids=(200, 201))))
    got = daemon.scrape(daemon.snapshot(nvml, (*HELD, *shared)))
    processes = {
        labels["pid"]: owners_of(labels) for name, labels in got if name == "jaxmon_process_device_memory_bytes"
    }
    assert processes == {
        "100": TRAIN,  # no owner of its own: its GPU's, as before
        "200": {"namespace": "team-c", "pod": "notebook-1,notebook-2", "container": "jupyter"},
        "201": {"namespace": "team-c", "pod": "notebook-2", "container": "jupyter"},
    }
    # The GPU's own series stay the GPU's: both holders, joined.
    power = {labels["device"]: owners_of(labels) for name, labels in got if name == "jaxmon_device_power_watts"}
    assert power["1"]["pod"] == "notebook-1,notebook-2" and power["0"] == TRAIN


def test_owners_from_several_sources_are_merged_and_sole_identities_stay_sole() -> None:
    a, b = Owner("ns", "a", "c"), Owner("ns", "b", "c", extra=(("claim", "ns/gpu-claim"),))
    gpu0 = (GPU_UUID, UUIDS[0].lower())
    node = ("tpu_node", "")
    merged = Owners.merged(
        [
            Owners(devices={gpu0: frozenset({a}), node: frozenset({a})}, sole=frozenset({node})),
            Owners(devices={gpu0: frozenset({b}), node: frozenset({b})}),
        ]
    )
    assert merged.labels([gpu0]) == {"namespace": "ns", "pod": "a,b", "container": "c"}
    # Two containers hold the node's TPU chips, one per source: which one a chip is, is not certain.
    assert merged.labels([node]) == {}
    assert Owners.merged([Owners(devices={node: frozenset({a})}, sole=frozenset({node}))]).labels([node])["pod"] == "a"
    assert Owners().empty and not merged.empty


def test_the_transform_runs_once_per_snapshot_and_not_at_all_without_owners() -> None:
    daemon = Daemon([JAX_GPU0])
    nvml = NvmlState(gpus=(gpu(0),), match=DeviceMatch("only_gpu", {0: 0}))
    calls: list[int] = []

    def counted(snap: Snapshot, families: list[Metric]) -> list[Metric]:
        calls.append(snap.version)
        return daemon.transform(snap, families)

    snaps = [daemon.snapshot(nvml, HELD, version=1)]
    exposition = Exposition(lambda: snaps[-1], daemon.collectors, counted)
    first = exposition.render(want_gzip=False)
    for _ in range(5):
        exposition.render(want_gzip=True)
        assert exposition.render(want_gzip=False).split(b"# HELP process_")[0] == first.split(b"# HELP process_")[0]
    assert calls == [1]
    snaps.append(daemon.snapshot(nvml, HELD, version=2))
    exposition.render(want_gzip=False)
    assert calls == [1, 2]
    # No owner source: the families go through untouched (the same objects, no sample rebuilt).
    bare = daemon.snapshot(nvml)
    families = list(daemon.collectors[1].families(bare, nvml))
    samples = [s for fam in families for s in fam.samples]
    assert samples and daemon.transform.index(bare) is None
    assert daemon.transform(bare, families) is families
    assert all(a is b for a, b in zip([s for fam in families for s in fam.samples], samples, strict=True))
