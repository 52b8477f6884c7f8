"""The split of GPU and TPU profiles built by the fakes (tests/xspace_fakes.py), against intervals laid out here by
hand. Times in microseconds of the trace's clock; the reader's figures are picoseconds."""

from __future__ import annotations

import pytest

from jaxmon.xla.profile import read
from tests.xspace_fakes import START_UNIX_NS, Kernel, TpuOp, gpu_space, tpu_space

US = 1_000_000  # ps

# GPU 0, 100 us: compute on stream 7, NCCL on stream 13 overlapping it in part, copies on stream 14.
GPU0 = [
    Kernel(7, "loop_multiply_fusion", 0, 30, hlo_op="fusion.1"),
    Kernel(7, "gemm_fusion_dot_1", 40, 60, hlo_op="dot.2"),
    # all-reduce over [20, 50): hidden behind compute on [20, 30) and [40, 50), exposed on [30, 40)
    Kernel(13, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 50, hlo_op="all-reduce-start.1"),
    # all-gather alone: exposed on [70, 80)
    Kernel(13, "ncclDevKernel_AllGather_RING_LL", 70, 80, hlo_op="all-gather-start"),
    # a copy under compute on [55, 60) and under the all-gather on [70, 75): a copy only on [60, 70)
    Kernel(14, "MemcpyD2H", 55, 75, memcpy="kind_src:device kind_dst:pinned num_bytes:1048576"),
    Kernel(14, "MemcpyH2D", 85, 90, memcpy="kind_src:pinned kind_dst:device num_bytes:4096"),
]  # idle: [80, 85) and [90, 100)

# GPU 1: a collective wholly under compute (nothing exposed), an NCCL kernel with no hlo_op, XLA's own collective
# kernel (no "nccl" in its name) named by its hlo_op, and a Memset (compute).
GPU1 = [
    Kernel(7, "loop_add_fusion", 0, 60, hlo_op="fusion.3"),
    Kernel(13, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 10, 40, hlo_op="all-reduce-start.2"),
    Kernel(13, "ncclDevKernel_SendRecv", 60, 70),
    Kernel(15, "all_reduce_one_shot_kernel", 65, 75, hlo_op="all-reduce.7"),
    Kernel(7, "Memset", 90, 95),
]


def test_gpu_split_is_the_hand_laid_one() -> None:
    trace = read(gpu_space({0: GPU0, 1: GPU1}))
    # Only the GPU planes: the host plane's launch events (with hlo_op and device_ordinal) are not CPU devices.
    assert trace.devices == [("gpu", 0), ("gpu", 1)]
    assert trace.modules == {"jit_train_step"}
    assert trace.start_unix_ns == START_UNIX_NS
    splits = trace.split()
    g0, g1 = splits[("gpu", 0)], splits[("gpu", 1)]
    assert g0.window == 100 * US
    # compute [0,30)+[40,60); exposed collective [30,40)+[70,80); copy [60,70)+[85,90); idle [80,85)+[90,100)
    assert (g0.compute, g0.collective, g0.copy, g0.idle) == (50 * US, 20 * US, 15 * US, 15 * US)
    assert g0.collectives == {"all-reduce": 30 * US, "all-gather": 10 * US}
    # compute [0,60)+[90,95); exposed: SendRecv [60,70), XLA's all-reduce [70,75); the rest idle
    assert (g1.compute, g1.collective, g1.copy, g1.idle) == (65 * US, 15 * US, 0, 20 * US)
    assert g1.collectives == {"all-reduce": 30 * US + 10 * US, "send-recv": 10 * US}
    for s in splits.values():
        assert s.compute + s.collective + s.copy + s.idle == s.window


def test_gpu_split_of_a_window() -> None:
    trace = read(gpu_space({0: GPU0}))
    s = trace.split(25_000, 72_000)  # ns: [25, 72) us
    assert (s[("gpu", 0)].compute, s[("gpu", 0)].collective, s[("gpu", 0)].copy, s[("gpu", 0)].idle) == (
        25 * US,  # [25,30) + [40,60)
        12 * US,  # [30,40) + [70,72)
        10 * US,  # [60,70)
        0,
    )
    assert trace.trace_ns(START_UNIX_NS + 25_000) == 25_000


# TPU 0, 100 us: a while loop whose body holds a convolution and an all-reduce (the innermost op owns each instant),
# a host-offload copy in flight on "Async XLA Ops" and waited for on "XLA Ops", an async all-gather.
TPU0 = [
    TpuOp("fusion.1", 0, 20, "loop fusion"),
    TpuOp("while.1", 20, 60, "while"),  # its own time: [20, 22) and [55, 60)
    TpuOp("convolution.2", 22, 40, "convolution"),
    TpuOp("all-reduce.3", 40, 55, "all-reduce"),
    TpuOp("copy-done.4", 60, 70, "copy-done"),
    TpuOp("all-gather-done.5", 75, 80, "all-gather"),
    TpuOp("copy-start.4", 50, 70, "async-copy", asynchronous=True),  # under the all-reduce and the loop until 60
    TpuOp("all-gather-start.5", 65, 80, "all-gather", asynchronous=True),  # wins over the copy on [65, 70)
]  # idle: [80, 100)

# TPU 1: XProf's fusion categories of collectives, and a reduce-scatter hidden behind compute.
TPU1 = [
    TpuOp("fusion.7", 0, 50, "convolution fusion"),
    TpuOp("all-reduce-scatter-fusion.2", 50, 60, "all-reduce-scatter fusion"),
    TpuOp("fusion.9", 60, 62, "all-gather fusion"),
    TpuOp("reduce-scatter.4", 10, 30, "reduce-scatter", asynchronous=True),
    TpuOp("outfeed.1", 90, 100, "outfeed"),
]


def test_tpu_split_is_the_hand_laid_one() -> None:
    trace = read(tpu_space({0: TPU0, 1: TPU1}))
    assert trace.devices == [("tpu", 0), ("tpu", 1)]
    assert trace.modules == {"jit_train_step"}
    splits = trace.split()
    t0, t1 = splits[("tpu", 0)], splits[("tpu", 1)]
    # compute [0,40)+[55,60); collective [40,55)+[65,80); copy [60,65); idle [80,100)
    assert (t0.compute, t0.collective, t0.copy, t0.idle) == (45 * US, 30 * US, 5 * US, 20 * US)
    assert t0.collectives == {"all-reduce": 15 * US, "all-gather": 15 * US}
    assert (t1.compute, t1.collective, t1.copy, t1.idle) == (50 * US, 12 * US, 10 * US, 28 * US)
    assert t1.collectives == {"reduce-scatter": 20 * US + 10 * US, "all-gather": 2 * US}
    window = trace.split(10_000, 70_000)[("tpu", 0)]
    assert (window.compute, window.collective, window.copy, window.idle) == (35 * US, 20 * US, 5 * US, 0)


def test_collectives_by_name_from_the_compiled_program() -> None:
    """Ops named after JAX primitives are collectives; so is any instruction the caller names from the HLO."""
    ops = [
        TpuOp("ppermute.3", 0, 10, "collective-permute-done"),
        TpuOp("reduce_scatter.7", 10, 20, ""),
        TpuOp("psum.2", 20, 30, ""),
        TpuOp("custom-call.4", 30, 40, "custom-call"),  # only the caller's map says it is one
    ]
    data = tpu_space({0: ops})
    plain = read(data).split()[("tpu", 0)]
    assert plain.collectives == {"collective-permute": 10 * US, "reduce-scatter": 10 * US, "all-reduce": 10 * US}
    assert plain.compute == 10 * US
    named = read(data, {"custom-call.4": "all-to-all"}).split()[("tpu", 0)]
    assert named.collectives["all-to-all"] == 10 * US and named.compute == 0


def test_copies_are_split_by_direction_with_their_bytes() -> None:
    """GPU 0, 100 us: a cross-device copy (MemcpyP2P, CUPTI's details in today's `size:` spelling) alone on
    [0, 20), a MemcpyD2D on [10, 30) beside it (each counts [10, 20)), compute on [25, 40) hiding the D2D's end, and
    a copy whose direction only its details say (host to device) on [50, 60). The copy part is the union; each
    direction's share counts the instants it ran with nothing but copies; the bytes are the events' sizes."""
    from jaxmon.training.trace_links import PlacedTotals

    kernels = [
        Kernel(14, "MemcpyP2P", 0, 20, memcpy="kind_src:device kind_dst:device size:8388608 dest:1 async:1"),
        Kernel(15, "MemcpyD2D", 10, 30, memcpy="kind_src:device kind_dst:device size:65536 dest:0 async:1"),
        Kernel(7, "loop_add_fusion", 25, 40, hlo_op="fusion.1"),
        Kernel(14, "Memcpy", 50, 60, memcpy="kind_src:pageable kind_dst:device size:4096 dest:0 async:0"),
    ]
    [s] = read(gpu_space({0: kernels})).split().values()
    assert s.copy == 35_000_000 and s.compute == 15_000_000  # picoseconds
    totals = PlacedTotals()
    totals.add(s, 1e-12)
    assert totals.copy_seconds == pytest.approx({"device_to_device": 20e-6 + 15e-6, "host_to_device": 10e-6})
    assert totals.copy_bytes == {"device_to_device": 8388608 + 65536, "host_to_device": 4096}
