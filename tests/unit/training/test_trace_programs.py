"""A sampled trace's collective events placed by program AND instruction (jaxmon.training.trace_links.Catalog), on
built GPU and TPU XSpaces (tests/xspace_fakes.py) where two programs share instruction names: a train step and an
eval step both have `all-reduce.1`, placed on other axes and links. The truth: which program each event was written
as, and the places and bytes the test gave each program."""

from __future__ import annotations

import pytest

from jaxmon.training.trace_links import AMBIGUOUS, UNNAMED, Catalog, PlacedTotals, ProgramPlaces
from jaxmon.xla.profile import read
from tests.xspace_fakes import Kernel, TpuOp, gpu_space, tpu_space

TRAIN = {"all-reduce.1": ("all-reduce", "fsdp", "nvlink", 4096.0)}
EVAL = {"all-reduce.1": ("all-reduce", "data", "network", 512.0)}
# A TPU op's event is named by its whole HLO text: the instruction is the name before " = ".
TPU_OP = "%all-reduce.1 = f32[1024]{0} all-reduce(f32[1024]{0} %param.1), replica_groups={{0,1}}, to_apply=%add"


def totals(data: bytes, catalog: Catalog) -> dict[tuple[str, int], PlacedTotals]:
    out = {}
    for device, split in read(data, catalog).split().items():
        out[device] = PlacedTotals()
        out[device].add(split, 1e-12)
    return out


def gpu_two_programs(module_b: str = "jit_step") -> bytes:
    """Device 0: two runs of program 5 (`jit_step`) and one of program 9, each one `all-reduce.1` kernel."""
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    kernels = [
        Kernel(7, nccl, 0, 10, hlo_op="all-reduce.1", module="jit_step", program_id=5),
        Kernel(7, nccl, 20, 30, hlo_op="all-reduce.1", module="jit_step", program_id=5),
        Kernel(7, nccl, 40, 45, hlo_op="all-reduce.1", module=module_b, program_id=9),
    ]
    return gpu_space({0: kernels})


def test_gpu_events_are_placed_by_their_programs_id_not_their_instructions_name() -> None:
    catalog = Catalog([ProgramPlaces("jit_step", 5, TRAIN), ProgramPlaces("jit_step", 9, EVAL)])
    [(device, t)] = totals(gpu_two_programs(), catalog).items()
    assert device == ("gpu", 0)
    assert t.bytes == {("all-reduce", "fsdp", "nvlink"): 2 * 4096.0, ("all-reduce", "data", "network"): 512.0}
    assert t.seconds == pytest.approx(
        {("all-reduce", "fsdp", "nvlink"): 20e-6, ("all-reduce", "data", "network"): 5e-6}
    )
    assert t.unplaced == {}
    # the eval program not analysed: its event is no analysed program's (its id is not 5): unplaced, no bytes
    [t] = totals(gpu_two_programs(), Catalog([ProgramPlaces("jit_step", 5, TRAIN)])).values()
    assert t.bytes == {("all-reduce", "fsdp", "nvlink"): 2 * 4096.0}
    assert t.seconds == pytest.approx({("all-reduce", "fsdp", "nvlink"): 20e-6, ("all-reduce", "", "unknown"): 5e-6})
    assert t.unplaced == {}


def tpu_programs(train: str, evaluation: str, bare: bool = False) -> bytes:
    """Chip 0: the train program (id 111) runs an all-reduce, then the eval program (id 222) two; the op events are
    named alike (the same HLO text) and told apart by their metadata's program_id (or, `bare`, by the span of the
    `XLA Modules` event they fall in)."""
    ops = [
        TpuOp(TPU_OP, 0, 10, "all-reduce", module=train, program_id=111, bare=bare),
        TpuOp("%fusion.2 = f32[1024]{0} fusion(f32[1024]{0} %p)", 10, 20, "loop fusion", module=train, program_id=111),
        TpuOp(TPU_OP, 30, 34, "all-reduce", module=evaluation, program_id=222, bare=bare),
        TpuOp(TPU_OP, 40, 44, "all-reduce", module=evaluation, program_id=222, bare=bare),
    ]
    return tpu_space({0: ops})


def test_tpu_events_are_placed_by_module_name_from_the_xla_modules_line() -> None:
    """A TPU trace's program ids are fingerprints the analysis does not read (program_id None): the module's name,
    which the `XLA Modules` line gives each id (or each span), and the instruction place the event."""
    catalog = Catalog([ProgramPlaces("jit_train", None, TRAIN), ProgramPlaces("jit_eval", None, EVAL)])
    for bare in (False, True):
        [(device, t)] = totals(tpu_programs("jit_train", "jit_eval", bare), catalog).items()
        assert device == ("tpu", 0)
        assert t.bytes == {("all-reduce", "fsdp", "nvlink"): 4096.0, ("all-reduce", "data", "network"): 2 * 512.0}
        assert t.seconds == pytest.approx(
            {("all-reduce", "fsdp", "nvlink"): 10e-6, ("all-reduce", "data", "network"): 8e-6}
        )
        assert t.unplaced == {}, bare


def test_programs_of_one_name_that_disagree_place_nothing_and_count_why() -> None:
    """Two jits of functions named alike (`jit_step`) whose `all-reduce.1` lie on other axes: without an id that
    tells them apart the event could be either's: unknown, counted, never the other's place."""
    catalog = Catalog([ProgramPlaces("jit_step", None, TRAIN), ProgramPlaces("jit_step", None, EVAL)])
    [t] = totals(tpu_programs("jit_step", "jit_step"), catalog).values()
    assert t.bytes == {}
    assert t.seconds == pytest.approx({("all-reduce", "", "unknown"): 18e-6})
    assert t.unplaced == {AMBIGUOUS: 3}
    # programs of one name that agree on the place: placed
    same = Catalog([ProgramPlaces("jit_step", None, TRAIN), ProgramPlaces("jit_step", None, dict(TRAIN))])
    [t] = totals(tpu_programs("jit_step", "jit_step"), same).values()
    assert t.bytes == {("all-reduce", "fsdp", "nvlink"): 3 * 4096.0} and t.unplaced == {}


def test_an_event_whose_trace_names_no_program_is_not_placed() -> None:
    """A GPU kernel with `hlo_op` but neither `hlo_module` nor `program_id`, outside any `XLA Modules` span: the
    instruction is an analysed one, but of which program the trace does not say."""
    from tests.xspace_fakes import FakeSpace

    space = FakeSpace()
    plane = space.plane("/device:GPU:0", id=1)
    plane.line("Stream #7(Kernel)", id=7).event("ncclKernel_AllReduce", 0, 10, {"hlo_op": "all-reduce.1"})
    catalog = Catalog([ProgramPlaces("jit_step", 5, TRAIN)])
    [t] = totals(space.encode(), catalog).values()
    assert t.bytes == {} and t.unplaced == {UNNAMED: 1}
    assert t.seconds == pytest.approx({("all-reduce", "", "unknown"): 10e-6})
