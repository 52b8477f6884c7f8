"""The kubelet source's reading of a ListPodResourcesResponse: device-plugin devices and DRA claims side by side."""

from __future__ import annotations

from jaxmon.sources.kubelet import Allocation, ClaimedDevice, allocations, claimed_devices
from jaxmon.sources.kubelet.stubs import stubs

UUID = "GPU-3d4f1c2a-9b8e-4c1d-a2b3-c4d5e6f70819"


def _response() -> object:
    pb, _ = stubs()
    both = pb.ContainerResources(
        name="main",
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[UUID])],
        dynamic_resources=[
            pb.DynamicResource(
                claim_name="train-gpus",
                claim_namespace="team",
                claim_resources=[
                    pb.ClaimResource(
                        driver_name="gpu.nvidia.com",
                        pool_name="node-a",
                        device_name="gpu-1",
                        cdi_devices=[pb.CDIDevice(name="k8s.gpu.nvidia.com/claim=abc-gpu-1")],
                    ),
                    pb.ClaimResource(
                        driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-2", share_id="s-7"
                    ),
                ],
            )
        ],
    )
    dra_only = pb.ContainerResources(
        name="sidecar",
        dynamic_resources=[
            pb.DynamicResource(
                claim_name="tpus",
                claim_resources=[
                    pb.ClaimResource(driver_name="tpu.google.com", pool_name="node-a", device_name="accel0")
                ],
            )
        ],
    )
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(name="train", namespace="team", containers=[both, dra_only]),
            pb.PodResources(name="idle", namespace="other", containers=[pb.ContainerResources(name="x")]),
        ]
    )


def test_dra_claims_are_read_beside_device_plugin_devices() -> None:
    response = _response()
    assert allocations(response) == (Allocation("team", "train", "main", "nvidia.com/gpu", (UUID,)),)
    assert claimed_devices(response) == (
        ClaimedDevice(
            "team", "train", "main", "train-gpus", "team", "gpu.nvidia.com", "node-a", "gpu-1",
            cdi_devices=("k8s.gpu.nvidia.com/claim=abc-gpu-1",),
        ),
        ClaimedDevice(
            "team", "train", "main", "train-gpus", "team", "gpu.nvidia.com", "node-a", "gpu-2", share_id="s-7"
        ),
        # A claim without its namespace is the pod's (claims are namespaced).
        ClaimedDevice("team", "train", "sidecar", "tpus", "team", "tpu.google.com", "node-a", "accel0"),
    )  # fmt: skip


def test_a_response_without_dra_has_no_claimed_devices() -> None:
    pb, _ = stubs()
    response = pb.ListPodResourcesResponse(
        pod_resources=[pb.PodResources(name="p", namespace="n", containers=[pb.ContainerResources(name="c")])]
    )
    assert claimed_devices(response) == ()
