"""The link of every collective group (jaxmon.training.links): from the groups and each device's descriptor."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jaxmon.training import links
from jaxmon.training.links import DeviceTopology, describe, group_link, nvml_link, place
from jaxmon.xla import hlo


def cpus(processes: int, per: int) -> dict[int, DeviceTopology]:
    return {i: DeviceTopology(i, "cpu", i // per) for i in range(processes * per)}


def tpus(slices: list[int | None]) -> dict[int, DeviceTopology]:
    return {i: DeviceTopology(i, "tpu", i // 4, slice_index=s, coords=(i % 2, i // 2, 0)) for i, s in enumerate(slices)}


ASSIGN8 = tuple(range(8))


def test_cpu_devices_are_local_within_a_process_and_network_across() -> None:
    devices = cpus(2, 4)
    assert group_link([(0, 1, 2, 3), (4, 5, 6, 7)], ASSIGN8, devices) == ("local", None)
    assert group_link([(0, 4), (1, 5), (2, 6), (3, 7)], ASSIGN8, devices) == ("network", None)
    # the slowest group wins: one group across processes makes the collective's link the network
    assert group_link([(0, 1), (3, 4)], ASSIGN8, devices) == ("network", None)
    # groups of one device cross nothing
    assert group_link([(i,) for i in range(8)], ASSIGN8, devices) == ("local", None)


def test_groups_index_the_program_assignment_not_device_ids() -> None:
    devices = cpus(2, 4)
    # flattened ids 0 and 1 are devices 0 and 4 in this assignment: across processes
    assert group_link([(0, 1)], (0, 4, 1, 5, 2, 6, 3, 7), devices) == ("network", None)
    assert group_link([(0, 2)], (0, 4, 1, 5, 2, 6, 3, 7), devices) == ("local", None)


def test_tpu_chips_are_ici_within_a_slice_and_dcn_across() -> None:
    devices = tpus([0, 0, 0, 0, 1, 1, 1, 1])
    assert group_link([(0, 1, 2, 3)], ASSIGN8, devices) == ("ici", None)
    assert group_link([(0, 4)], ASSIGN8, devices) == ("dcn", None)
    assert group_link([(0, 1), (2, 6)], ASSIGN8, devices) == ("dcn", None)


def test_tpus_without_slice_index_are_ici_within_a_process_and_unknown_across() -> None:
    devices = tpus([0, 0, None, 0, None, 1, 1, 1])  # processes: chips 0-3, 4-7
    assert group_link([(0, 1)], ASSIGN8, devices) == ("ici", None)
    # one host's chips are one slice's: no slice_index needed (a single-host TPU VM's devices have none)
    assert group_link([(0, 2)], ASSIGN8, devices) == ("ici", None)
    # across processes, a chip without slice_index may be in another slice: never guessed
    assert group_link([(0, 4)], ASSIGN8, devices) == ("unknown", "slice")
    assert group_link([(2, 5)], ASSIGN8, devices) == ("unknown", "slice")


def test_gpus_of_one_host_follow_nvml_pairwise() -> None:
    devices = {i: DeviceTopology(i, "gpu", 0, host="h0") for i in range(4)}
    table = {frozenset((0, 1)): "nvlink", frozenset((2, 3)): "nvlink"}

    def pairs(a: int, b: int) -> str | None:
        return table.get(frozenset((a, b)), "pcie" if {a, b} <= {0, 1, 2} else "sys")

    assert group_link([(0, 1), (2, 3)], (0, 1, 2, 3), devices, pairs) == ("nvlink", None)
    assert group_link([(0, 2)], (0, 1, 2, 3), devices, pairs) == ("pcie", None)
    # every pair of the group: 0-1 NVLink, 0-3 and 1-3 across NUMA nodes -> sys
    assert group_link([(0, 1, 3)], (0, 1, 2, 3), devices, pairs) == ("sys", None)
    # without NVML's topology the link between two GPUs of one host is not known
    assert group_link([(0, 1)], (0, 1, 2, 3), devices, None) == ("unknown", "topology")
    assert group_link([(0, 1)], (0, 1, 2, 3), devices, lambda a, b: None) == ("unknown", "topology")


def test_gpus_of_other_processes_are_network_only_where_their_hosts_are_known_to_differ() -> None:
    unknown_hosts = {0: DeviceTopology(0, "gpu", 0, host="h0"), 1: DeviceTopology(1, "gpu", 1)}
    assert group_link([(0, 1)], (0, 1), unknown_hosts, lambda a, b: "nvlink") == ("unknown", "host")
    known = {0: DeviceTopology(0, "gpu", 0, host="h0"), 1: DeviceTopology(1, "gpu", 1, host="h1")}
    assert group_link([(0, 1)], (0, 1), known, None) == ("network", None)
    same = {0: DeviceTopology(0, "gpu", 0, host="h0"), 1: DeviceTopology(1, "gpu", 1, host="h0")}
    assert group_link([(0, 1)], (0, 1), same, lambda a, b: "nvlink") == ("nvlink", None)


def test_network_wins_over_an_unknown_pair_and_unknown_over_any_faster_link() -> None:
    devices = {**cpus(2, 4)}
    del devices[1]
    # one group crosses processes: nothing is slower than the network, whatever the unknown device's link
    assert group_link([(0, 1), (3, 4)], ASSIGN8, devices) == ("network", None)
    # no group known to cross the network, one device unknown: unknown (it may be anywhere)
    assert group_link([(0, 1), (2, 3)], ASSIGN8, devices) == ("unknown", "device")


def test_unknown_without_an_assignment_or_for_ids_outside_it() -> None:
    assert group_link([(0, 1)], None, cpus(1, 2)) == ("unknown", "assignment")
    assert group_link([(0, 5)], (0, 1), cpus(1, 2)) == ("unknown", "device")


def test_mixed_or_unknown_platforms_are_unknown() -> None:
    devices = {0: DeviceTopology(0, "cpu", 0), 1: DeviceTopology(1, "gpu", 0, host="h")}
    assert group_link([(0, 1)], (0, 1), devices) == ("unknown", "topology")
    other = {0: DeviceTopology(0, "neuron", 0), 1: DeviceTopology(1, "neuron", 0)}
    assert group_link([(0, 1)], (0, 1), other) == ("unknown", "topology")


@pytest.mark.parametrize(
    ("ancestor", "p2p", "peer", "link"),
    [
        (0, None, False, "pcie"),
        (10, False, False, "pcie"),
        (30, None, False, "pcie"),
        (40, None, False, "sys"),
        (50, None, False, "sys"),
        (50, None, True, "nvlink"),
        (None, True, False, "nvlink"),
        (None, None, False, None),
        (60, None, False, None),
    ],
)
def test_nvml_answers_name_the_link(ancestor: int | None, p2p: bool | None, peer: bool, link: str | None) -> None:
    assert nvml_link(ancestor, p2p, peer) == link


def test_descriptors_read_what_the_device_says() -> None:
    tpu = SimpleNamespace(id=5, platform="tpu", process_index=1, slice_index=1, coords=[1, 0, 0])
    assert describe(tpu, "h", 0) == DeviceTopology(5, "tpu", 1, slice_index=1, coords=(1, 0, 0))
    # a TPU device without slice_index (older runtimes), and a bool is no slice index
    bare = SimpleNamespace(id=0, platform="tpu", process_index=0, slice_index=True)
    assert describe(bare, "h", 0).slice_index is None
    gpu_here = SimpleNamespace(id=0, platform="gpu", process_index=0)
    gpu_there = SimpleNamespace(id=8, platform="gpu", process_index=1)
    assert describe(gpu_here, "h", 0).host == "h"
    assert describe(gpu_there, "h", 0).host is None  # another process's host is not known
    assert describe(SimpleNamespace(id=1, platform="cpu", process_index=0), "h", 0).host is None


# A program of two collectives over the two axes of a (2, 4) mesh: what jax compiles for psum over each axis, with
# flattened ids into the mesh's device order.
HLO = """HloModule jit_step, replica_count=1, num_partitions=8

ENTRY %main (p: f32[16,16]) -> f32[16,16] {
  %p = f32[16,16]{1,0} parameter(0)
  %all-reduce.1 = f32[16,16]{1,0} all-reduce(%p), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %all-reduce.2 = f32[16,16]{1,0} all-reduce(%all-reduce.1), channel_id=2, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=%add
}
"""  # noqa: E501


def test_place_names_each_collective_axes_and_link_and_swapping_the_axes_swaps_the_links() -> None:
    program = hlo.parse(HLO)
    devices = cpus(2, 4)  # devices 0-3 in process 0, 4-7 in process 1
    nbytes = 16 * 16 * 4
    mesh = hlo.MeshLayout(("proc", "local"), (2, 4), tuple(range(8)))
    placed = place(program, mesh, None, devices)
    assert placed.collective_bytes == {
        ("all-reduce", "proc", "network"): nbytes,
        ("all-reduce", "local", "local"): nbytes,
    }
    assert placed.places == {
        "all-reduce.1": ("all-reduce", "proc", "network"),
        "all-reduce.2": ("all-reduce", "local", "local"),
    }
    assert placed.sizes == {"all-reduce.1": nbytes, "all-reduce.2": nbytes} and placed.unknown == {}
    # The same axes over the same devices, transposed: "proc" now runs inside each process, "local" across them.
    swapped = hlo.MeshLayout(("proc", "local"), (2, 4), (0, 4, 1, 5, 2, 6, 3, 7))
    placed = place(program, swapped, swapped.device_ids, devices)
    assert placed.collective_bytes == {
        ("all-reduce", "proc", "local"): nbytes,
        ("all-reduce", "local", "network"): nbytes,
    }


def test_place_counts_unknown_links_by_why() -> None:
    program = hlo.parse(HLO)
    mesh = hlo.MeshLayout(("proc", "local"), (2, 4), tuple(range(8)))
    placed = place(program, mesh, None, tpus([0, 0, 0, 0, None, None, None, None]))
    assert placed.collective_bytes[("all-reduce", "proc", "unknown")] == 16 * 16 * 4
    # "local" stays in each process (its chips one host's, one slice): ici; "proc" crosses to chips without a slice
    assert placed.collective_bytes[("all-reduce", "local", "ici")] == 16 * 16 * 4
    assert placed.unknown == {"slice": 1}
    assert links.REASONS == ("device", "assignment", "slice", "host", "topology")
