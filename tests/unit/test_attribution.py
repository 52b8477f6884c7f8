"""Which pod holds which device (jaxmon.ownership.attribution), on literal allocations as the kubelet lists them."""

from __future__ import annotations

import pytest

from jaxmon.exchange import Owner, owner_labels
from jaxmon.ownership.attribution import Attribution, accelerators, attribute, gpu_key, matches
from jaxmon.sources.kubelet import Allocation

UUID = "GPU-3d4f1c2a-9b8e-4c1d-a2b3-c4d5e6f70819"
MIG = "MIG-5e0b7a41-2c3d-5f6e-8a9b-0c1d2e3f4a5b"


def alloc(pod: str, resource: str, *ids: str, namespace: str = "team", container: str = "main") -> Allocation:
    return Allocation(namespace, pod, container, resource, ids)


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        (UUID, ("uuid", UUID.lower())),
        (UUID.upper(), ("uuid", UUID.lower())),  # compared without case
        (f"{UUID}::0", ("uuid", UUID.lower())),  # NVIDIA's time-slicing replicas: the same GPU
        (f"{UUID}::17", ("uuid", UUID.lower())),
        (MIG, ("mig", MIG.lower())),
        (f"{MIG}::2", ("mig", MIG.lower())),
        (
            "MIG-GPU-3d4f1c2a-9b8e-4c1d-a2b3-c4d5e6f70819/1/0",
            ("mig", "mig-gpu-3d4f1c2a-9b8e-4c1d-a2b3-c4d5e6f70819/1/0"),
        ),
        ("nvidia0", ("minor", "0")),
        ("nvidia12", ("minor", "12")),
        ("nvidia3/vgpu1", ("minor", "3")),  # GKE's GPU time-sharing
        ("nvidia3::1", ("minor", "3")),
        # GKE's MIG partitions name no MIG UUID; other ids name no GPU.
        ("nvidia0/gi1", None),
        ("nvidia0/gi1/vgpu0", None),
        ("0", None),
        ("GPU-", None),
        ("gpu-0", None),
        ("", None),
    ],
)
def test_gpu_ids_in_every_form_the_device_plugins_use(device_id: str, key: tuple[str, str] | None) -> None:
    assert gpu_key(device_id) == key


def test_resource_names_match_exactly_or_by_pattern() -> None:
    patterns = ("nvidia.com/gpu", "nvidia.com/mig-*")
    assert matches("nvidia.com/gpu", patterns)
    assert matches("nvidia.com/mig-1g.10gb", patterns)
    assert not matches("nvidia.com/gpu.shared", patterns)
    assert not matches("amd.com/gpu", patterns)
    assert not matches("NVIDIA.com/gpu", patterns)


def test_one_holder_gives_its_names_and_several_give_their_distinct_names_joined() -> None:
    assert owner_labels([]) == {}
    assert owner_labels([Owner("ns", "p", "c")]) == {"namespace": "ns", "pod": "p", "container": "c"}
    shared = [Owner("team-b", "nb-2", "jupyter"), Owner("team-a", "nb-1", "jupyter"), Owner("team-a", "nb-1", "x")]
    assert owner_labels(shared) == {"namespace": "team-a,team-b", "pod": "nb-1,nb-2", "container": "jupyter,x"}
    assert owner_labels([Owner("ns", "p", "c"), Owner("ns", "p", "c")]) == owner_labels([Owner("ns", "p", "c")])


def test_gpus_are_found_by_uuid_or_minor_number_and_time_slices_join_their_pods() -> None:
    other = "GPU-00000000-0000-0000-0000-000000000001"
    a = attribute(
        [
            alloc("train", "nvidia.com/gpu", UUID, container="trainer"),
            alloc("infer", "nvidia.com/gpu", "nvidia3", namespace="serving"),
            alloc("nb-1", "nvidia.com/gpu", f"{other}::0"),
            alloc("nb-2", "nvidia.com/gpu", f"{other}::3", f"{other}::4"),
            alloc("mig", "nvidia.com/mig-1g.10gb", MIG),
        ]
    )
    assert a.gpu(UUID, 0) == {"namespace": "team", "pod": "train", "container": "trainer"}
    assert a.gpu(UUID.upper(), None) == a.gpu(UUID, None)
    assert a.gpu("GPU-ffffffff-0000-0000-0000-000000000000", 3) == {
        "namespace": "serving",
        "pod": "infer",
        "container": "main",
    }
    assert a.gpu(None, 3) == a.gpu("GPU-ffffffff-0000-0000-0000-000000000000", 3)
    assert a.gpu(other, 1) == {"namespace": "team", "pod": "nb-1,nb-2", "container": "main"}
    # Not held: nothing. A MIG device's pod does not label its parent GPU; MIG series ask by MIG UUID.
    assert a.gpu("GPU-ffffffff-0000-0000-0000-000000000000", 5) == {}
    assert a.gpu(None, None) == {}
    assert a.mig(MIG) == {"namespace": "team", "pod": "mig", "container": "main"}
    assert a.mig(MIG.upper()) == a.mig(MIG)
    assert a.mig("MIG-00000000-0000-0000-0000-000000000000") == {}


def test_only_the_configured_resources_count() -> None:
    found = [alloc("x", "example.com/fpga", UUID), alloc("y", "amd.com/gpu", "nvidia0")]
    assert attribute(found).gpu(UUID, 0) == {}
    assert attribute(found, gpu_resources=("amd.com/gpu",)).gpu(None, 0) == {
        "namespace": "team",
        "pod": "y",
        "container": "main",
    }
    assert accelerators(found) == ()
    assert accelerators(found, gpu_resources=("amd.com/*",)) == (found[1],)


def test_a_tpu_carries_the_one_container_holding_chips_and_nothing_when_several_do() -> None:
    one = attribute([alloc("job", "google.com/tpu", "0", "1", "2", "3", container="jax")])
    # Whatever libtpu's device-ids are (8, 9, 12, 13 is normal): the process serving them holds the chips.
    for device in (0, 3, 8, 13):
        assert one.tpu(device) == {"namespace": "team", "pod": "job", "container": "jax"}
    two = attribute([alloc("a", "google.com/tpu", "0", "1"), alloc("b", "google.com/tpu", "2", "3")])
    assert two.tpu(0) == {} and two.tpu(2) == {}
    # Two containers of one pod are two holders too; GPUs do not count.
    assert attribute([alloc("a", "google.com/tpu", "0"), alloc("a", "google.com/tpu", "1", container="x")]).tpu(0) == {}
    assert attribute([alloc("a", "google.com/tpu", "0"), alloc("b", "nvidia.com/gpu", UUID)]).tpu(0)["pod"] == "a"
    assert Attribution().tpu(0) == {}


def test_the_tpu_collectors_chip_and_host_series_carry_the_holder_of_the_chips() -> None:
    """Through the owner transform's index, with the identities the tpu collector's state offers for its series."""
    from jaxmon.collectors.tpu import TpuDevice, TpuState, chip_labels, host_labels
    from jaxmon.ownership.owners import OwnerIndex

    identities = TpuState(devices=(TpuDevice(9, True),)).identities

    def owned(attribution: Attribution, labels: dict[str, str]) -> dict[str, str]:
        return {**labels, **OwnerIndex(attribution.owners, identities, "node", None).labels_of(labels)}

    one = attribute([alloc("job", "google.com/tpu", "0", "1", container="jax")])
    holder = {"namespace": "team", "pod": "job", "container": "jax"}
    assert owned(one, chip_labels(9)) == {"device": "9", "platform": "tpu", "source": "libtpu", **holder}
    # The megascale series are the service's, whose process holds the chips.
    assert owned(one, host_labels()) == {"source": "libtpu", **holder}
    assert chip_labels(9) == {"device": "9", "platform": "tpu", "source": "libtpu"} and host_labels() == {
        "source": "libtpu"
    }
    two = attribute([alloc("a", "google.com/tpu", "0"), alloc("b", "google.com/tpu", "1")])
    assert owned(two, host_labels()) == {"source": "libtpu"}


def test_accelerators_are_listed_in_a_stable_order() -> None:
    found = [alloc("b", "google.com/tpu", "0"), alloc("a", "nvidia.com/gpu", UUID), alloc("a", "example.com/nic", "1")]
    assert [a.pod for a in accelerators(found)] == ["a", "b"]
