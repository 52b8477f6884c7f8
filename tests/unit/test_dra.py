"""Which GPU, MIG device or TPU chip a DRA claim's device is (jaxmon.ownership.dra), on literal ResourceSlice JSON as
the API server answers it (resource.k8s.io/v1) and claimed devices as the kubelet lists them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jaxmon.exchange import Owner, owner_labels
from jaxmon.ownership.dra import NO_IDENTITY, NOT_IN_SLICES, ProblemCounter, published_id, resolve
from jaxmon.sources.kubelet import ClaimedDevice
from jaxmon.sources.kubernetes_api import SliceDevice, SliceError, index_slices, slice_devices


def claim_holder(namespace: str, pod: str, container: str, claim: str) -> Owner:
    """The owner a DRA claim gives its device: the container, with the claim kept beside it."""
    return Owner(namespace, pod, container, (("claim", f"{namespace}/{claim}"),))


GPU0 = "GPU-3d4f1c2a-9b8e-4c1d-a2b3-c4d5e6f70819"
GPU1 = "GPU-8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"
MIG = "MIG-5e0b7a41-2c3d-5f6e-8a9b-0c1d2e3f4a5b"

# A ResourceSliceList as NVIDIA's DRA driver publishes it for node-a (one pool named after the node), written out
# as the API server serialises it; GPU 1 is MIG-partitioned.
NVIDIA = json.loads(
    """
{
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceSlice",
  "metadata": {"name": "node-a-gpu.nvidia.com-x7k2p"},
  "spec": {
    "driver": "gpu.nvidia.com",
    "nodeName": "node-a",
    "pool": {"name": "node-a", "generation": 3, "resourceSliceCount": 1},
    "devices": [
      {"name": "gpu-0", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": "GPU-3d4f1c2a-9b8e-4c1d-a2b3-c4d5e6f70819"},
        "index": {"int": 0}, "minor": {"int": 0}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "580.95.5"}, "addressingMode": {"string": "None"}},
       "capacity": {"memory": {"value": "80Gi"}}},
      {"name": "gpu-1-mig-1g10gb-0", "attributes": {
        "type": {"string": "mig"}, "uuid": {"string": "MIG-5e0b7a41-2c3d-5f6e-8a9b-0c1d2e3f4a5b"},
        "parentUUID": {"string": "GPU-8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"}, "index": {"int": 0},
        "parentIndex": {"int": 1}, "profile": {"string": "1g.10gb"}}},
      {"name": "gpu-2", "attributes": {"type": {"string": "gpu"}, "index": {"int": 2}}},
      {"name": "gpu-3", "attributes": {
        "gpu.nvidia.com/uuid": {"string": "GPU-8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"},
        "gpu.nvidia.com/type": {"string": "gpu"}, "futureKind": {"quantity": "3"}}}
    ]
  }
}
"""
)

TPU = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "node-a-tpu"},
    "spec": {
        "driver": "tpu.google.com",
        "nodeName": "node-a",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            # As kubernetes-sigs/dra-driver-google-tpu publishes them (abridged).
            {
                "name": "accel0",
                "attributes": {
                    "index": {"int": 0},
                    "uuid": {"string": "tpu-3c4df1c1-ee02"},
                    "tpuGen": {"string": "v6e"},
                    "chipCount": {"int": 4},
                },
            },
            {
                "name": "accel1",
                "attributes": {
                    "index": {"int": 1},
                    "uuid": {"string": "tpu-1a9a1690-6cdf"},
                    "tpuGen": {"string": "v6e"},
                    "chipCount": {"int": 4},
                },
            },
            {"name": "7"},  # a vfio chip without its index: the name's number
            {"name": "chip", "attributes": {}},
        ],
    },
}


def claimed(device: str, pod: str = "train", claim: str = "gpus", driver: str = "gpu.nvidia.com") -> ClaimedDevice:
    return ClaimedDevice("team", pod, "main", claim, "team", driver, "node-a", device)


def test_a_slice_is_read_with_its_attributes_in_the_drivers_domain_and_unknown_types_left_out() -> None:
    generation, devices = slice_devices(NVIDIA)
    assert generation == 3
    assert [d.name for d in devices] == ["gpu-0", "gpu-1-mig-1g10gb-0", "gpu-2", "gpu-3"]
    assert devices[0].attributes == {
        "type": "gpu",
        "uuid": GPU0,
        "index": 0,
        "minor": 0,
        "productName": "NVIDIA H100 80GB HBM3",
        "driverVersion": "580.95.5",
        "addressingMode": "None",
    }
    # `gpu.nvidia.com/uuid` is `uuid`; an attribute type jaxmon does not know is skipped, not an error.
    assert devices[3].attributes == {"uuid": GPU1, "type": "gpu"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "spec.driver"),
        ({"driver": "gpu.nvidia.com"}, "spec.pool.name"),
        ({"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": "1"}}, "generation"),
        ({"driver": "d", "pool": {"name": "p"}, "devices": {"gpu-0": {}}}, "not a list"),
        ({"driver": "d", "pool": {"name": "p"}, "devices": [{"attributes": {}}]}, "without a name"),
        ({"driver": "d", "pool": {"name": "p"}, "devices": [{"name": "x", "attributes": {"uuid": "GPU-1"}}]}, "uuid"),
        ({"driver": "d", "pool": {"name": "p"}, "devices": [{"name": "x", "attributes": {"i": {"int": "1"}}}]}, "'i'"),
    ],
)
def test_a_slice_that_is_not_one_is_refused_naming_what_is_wrong(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SliceError, match=message) as err:
        slice_devices({"metadata": {"name": "broken"}, "spec": spec})
    assert "ResourceSlice broken" in str(err.value)


def test_each_pool_is_read_at_its_highest_generation_and_across_its_slices() -> None:
    def part(generation: int, *names: str) -> dict[str, Any]:
        devices = [{"name": n, "attributes": {"uuid": {"string": f"GPU-{n}"}}} for n in names]
        return {
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": generation}, "devices": devices}
        }

    index = index_slices([part(1, "gpu-0", "gpu-9"), part(2, "gpu-0"), part(2, "gpu-1"), part(1, "gpu-5")])
    assert sorted(index) == [("gpu.nvidia.com", "p", "gpu-0"), ("gpu.nvidia.com", "p", "gpu-1")]


@pytest.mark.parametrize(
    ("device", "key"),
    [
        (
            SliceDevice("gpu.nvidia.com", "n", "gpu-0", {"type": "gpu", "uuid": GPU0, "index": 0}),
            ("uuid", GPU0.lower()),
        ),
        (SliceDevice("gpu.nvidia.com", "n", "gpu-1-mig-0", {"type": "mig", "uuid": MIG}), ("mig", MIG.lower())),
        (SliceDevice("gpu.nvidia.com", "n", "m", {"uuid": MIG}), ("mig", MIG.lower())),  # a MIG UUID without `type`
        (SliceDevice("gpu.nvidia.com", "n", "gpu-2", {"type": "gpu", "index": 2}), None),  # no uuid: no guess
        (SliceDevice("gpu.nvidia.com", "n", "gpu-2", {"uuid": 7}), None),
        (SliceDevice("tpu.google.com", "n", "accel3", {"index": 5}), ("tpu", "5")),  # the attribute over the name
        (SliceDevice("tpu.google.com", "n", "accel7"), ("tpu", "7")),
        (SliceDevice("tpu.google.com", "n", "7"), ("tpu", "7")),
        (SliceDevice("tpu.google.com", "n", "chip", {"index": True}), None),
        (SliceDevice("example.com", "n", "gpu-0", {"uuid": GPU0}), None),  # not a driver jaxmon knows
    ],
)
def test_a_devices_identity_comes_from_its_attributes(device: SliceDevice, key: tuple[str, str] | None) -> None:
    assert published_id(device) == key


def test_claimed_gpus_mig_devices_and_tpu_chips_get_their_holders_with_the_claim() -> None:
    slices = index_slices([NVIDIA, TPU])
    found = [
        claimed("gpu-0"),
        claimed("gpu-1-mig-1g10gb-0", pod="notebook", claim="mig"),
        claimed("accel0", pod="tpu-job", claim="tpus", driver="tpu.google.com"),
        claimed("accel1", pod="tpu-job", claim="tpus", driver="tpu.google.com"),
        claimed("eth1", driver="net.example.com"),  # another driver's claim: not jaxmon's concern, not a problem
    ]
    got = resolve(slices, found)
    assert got.devices == {
        ("uuid", GPU0.lower()): frozenset({claim_holder("team", "train", "main", "gpus")}),
        ("mig", MIG.lower()): frozenset({claim_holder("team", "notebook", "main", "mig")}),
        ("tpu", "0"): frozenset({claim_holder("team", "tpu-job", "main", "tpus")}),
        ("tpu", "1"): frozenset({claim_holder("team", "tpu-job", "main", "tpus")}),
    }
    assert [key for _, key in got.resolved] == [
        ("uuid", GPU0.lower()),
        ("mig", MIG.lower()),
        ("tpu", "0"),
        ("tpu", "1"),
    ]
    assert got.unresolved == ()
    # The holders come out as the device-plugin path names them: the same labels.
    assert owner_labels(got.holders(("uuid", GPU0.lower()))) == {
        "namespace": "team",
        "pod": "train",
        "container": "main",
    }
    assert got.holders(("uuid", GPU1.lower())) == frozenset()


def test_a_gpu_shared_by_several_claims_has_every_holder() -> None:
    slices = index_slices([NVIDIA])
    got = resolve(slices, [claimed("gpu-0", pod="a", claim="c1"), claimed("gpu-0", pod="b", claim="c2")])
    assert got.holders(("uuid", GPU0.lower())) == {Owner("team", "a", "main"), Owner("team", "b", "main")}
    assert owner_labels(got.holders(("uuid", GPU0.lower())))["pod"] == "a,b"


def test_a_claimed_device_the_slices_do_not_name_or_without_a_uuid_is_a_problem_never_a_label() -> None:
    slices = index_slices([NVIDIA])
    got = resolve(
        slices,
        [
            claimed("gpu-5"),  # not published (yet)
            ClaimedDevice("team", "train", "main", "gpus", "team", "gpu.nvidia.com", "other-pool", "gpu-0"),
            claimed("gpu-2", pod="no-uuid"),  # published without a uuid
        ],
    )
    assert got.devices == {}
    assert [(u.claimed.device, u.claimed.pool, u.reason) for u in got.unresolved] == [
        ("gpu-5", "node-a", NOT_IN_SLICES),
        ("gpu-0", "other-pool", NOT_IN_SLICES),
        ("gpu-2", "node-a", NO_IDENTITY),
    ]


def test_problems_are_counted_once_per_device_and_again_when_one_comes_back() -> None:
    slices = index_slices([NVIDIA])
    counter = ProblemCounter()
    missing = resolve(slices, [claimed("gpu-5"), claimed("gpu-2")])
    counter.observe(missing)
    counter.observe(missing)  # the same devices at the next poll: not new problems
    assert counter.counts == {NOT_IN_SLICES: 1, NO_IDENTITY: 1}
    counter.observe(resolve(slices, [claimed("gpu-0")]))
    counter.observe(missing)
    assert counter.counts == {NOT_IN_SLICES: 2, NO_IDENTITY: 2}


def test_the_owner_transforms_map_has_gpus_by_uuid_and_tpu_chips_as_the_nodes() -> None:
    from jaxmon.exchange import TPU_DEVICE
    from jaxmon.ownership.attribution import TPU_ANY

    got = resolve(
        index_slices([NVIDIA, TPU]),
        [
            claimed("gpu-0"),
            claimed("gpu-1-mig-1g10gb-0", pod="notebook", claim="mig"),
            claimed("accel0", pod="tpu-job", claim="tpus", driver="tpu.google.com"),
            claimed("accel1", pod="tpu-job", claim="tpus", driver="tpu.google.com"),
        ],
    )
    owners = got.owners
    assert owners.labels([("uuid", GPU0.lower())]) == {"namespace": "team", "pod": "train", "container": "main"}
    assert owners.labels([("mig", MIG.lower())])["pod"] == "notebook"
    assert owners.labels([("uuid", GPU1.lower())]) == {}  # the MIG device's parent is not its pod's
    # TPU chips: DRA's index is not libtpu's device-id, so the holder is the node's one holder of chips.
    assert owners.labels([(TPU_DEVICE, "0"), TPU_ANY])["pod"] == "tpu-job"
    assert ("tpu", "0") not in owners.devices
    (owner,) = owners.devices[("uuid", GPU0.lower())]
    assert owner.extra == (("claim", "team/gpus"),)  # kept for the source, never a series label
    two = resolve(
        index_slices([TPU]),
        [
            claimed("accel0", pod="a", claim="t", driver="tpu.google.com"),
            claimed("accel1", pod="b", claim="t", driver="tpu.google.com"),
        ],
    )
    assert two.owners.labels([TPU_ANY]) == {}  # two holders of the node's chips: none labels libtpu's series
