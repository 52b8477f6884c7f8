"""The link between each two GPUs from NVML's topology calls (jaxmon/sources/nvml/topology.py), through NVML's real
C ABI: nvidia-ml-py loads the fake libnvidia-ml.so.1 (tests/fakenvml), whose scenario says each pair's common
ancestor, NVLink P2P status and NVLinks' far ends; the links are checked against that scenario."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from jaxmon.sources.nvml.topology import gpu_pairs
from tests.fakenvml import SONAME, Scenario, build, device, link

BUS = {i: f"00000000:{0x18 + i:02X}:00.0" for i in range(5)}  # device()'s bus ids


@pytest.fixture(scope="module", autouse=True)
def fake_library() -> None:
    ctypes.CDLL(str(build() / SONAME))


@pytest.fixture
def handles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, object]]:
    """Five GPUs: 0 and 1 on NVSwitch (P2P over NVLink), 2 and 3 NVLink-bridged (each link's far end the other's bus
    id, no P2P answer), 0 and 2 under one host bridge, 0-3, 1-2, 1-3 across the NUMA nodes; GPU 4 answers no topology
    call (NOT_SUPPORTED)."""
    devices = [
        device(0, topology={"1": 10, "2": 30, "3": 50}, p2p_nvlink={"1": True}),
        device(1, topology={"0": 10, "2": 40, "3": 50}, p2p_nvlink={"0": True}),
        device(2, topology={"0": 30, "1": 40, "3": 20}, nvlink=[link(2, n, remote=BUS[3]) for n in range(2)]),
        device(3, topology={"0": 50, "1": 50, "2": 20}, nvlink=[link(3, n, remote=BUS[2]) for n in range(2)]),
        device(4, nvlink=[], not_supported=["topology"]),
    ]
    scenario = Scenario(tmp_path / "scenario.json", devices)
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    pynvml.nvmlInit()
    try:
        yield {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(5)}
    finally:
        pynvml.nvmlShutdown()


def test_each_pair_reads_its_link_from_nvml(handles: dict[int, object]) -> None:
    pairs = gpu_pairs(handles)
    assert pairs == {
        frozenset((0, 1)): "nvlink",  # P2P over NVLink (NVSwitch)
        frozenset((2, 3)): "nvlink",  # each one's NVLink ends at the other
        frozenset((0, 2)): "pcie",  # one host bridge
        frozenset((0, 3)): "sys",
        frozenset((1, 2)): "sys",  # a NUMA node
        frozenset((1, 3)): "sys",
        **{frozenset((i, 4)): None for i in range(4)},  # GPU 4 answers nothing: unknown, never guessed
    }
    # The calls' own answers, as nvidia-ml-py reads them through the C ABI.
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[0], handles[2]) == pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    assert (
        pynvml.nvmlDeviceGetP2PStatus(handles[0], handles[1], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        == pynvml.NVML_P2P_STATUS_OK
    )
    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handles[2], 1).busId
    assert (remote.decode() if isinstance(remote, bytes) else remote) == BUS[3]


def test_the_pairs_key_by_jax_device_where_the_match_is_certain(handles: dict[int, object]) -> None:
    from jaxmon.sources.nvml.topology import by_jax_id

    pairs = gpu_pairs(handles)
    # NVML 0..3 are JAX devices 10..13 (GPU 4 not matched: its pairs are left out, as are the links NVML did not say)
    jax = by_jax_id(pairs, {0: 10, 1: 11, 2: 12, 3: 13})
    assert jax == {
        frozenset((10, 11)): "nvlink",
        frozenset((12, 13)): "nvlink",
        frozenset((10, 12)): "pcie",
        frozenset((10, 13)): "sys",
        frozenset((11, 12)): "sys",
        frozenset((11, 13)): "sys",
    }
