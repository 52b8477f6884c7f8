"""A real TPU trace (tests/fixtures/tpu-v5e-3steps.xplane.pb): the TPU layout's real counterpart to
tests/xspace_fakes.py. Recorded by jax.profiler.trace on a Cloud TPU v5e chip (libtpu 0.0.42.1, JAX 0.10.2) around
3 steps of a bf16 MLP (B=8192, D=4096, 4 layers, value_and_grad + SGD, donated; about 16.3 ms a step).

The independent truth is jaxlib's own XSpace parser (jax.profiler.ProfileData), read here line by line: the device
plane's `XLA Ops` events are the steps' ops (compute, and the `%copy-start`/`%copy-done` of XLA's host-memory
offload), `Steps` holds the three steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jax.profiler import ProfileData

from jaxmon.xla.profile import read

TRACE = Path(__file__).resolve().parents[2] / "fixtures" / "tpu-v5e-3steps.xplane.pb"
PS_PER_NS = 1000


def device_line(name: str) -> list[tuple[str, float]]:
    data = ProfileData.from_serialized_xspace(TRACE.read_bytes())
    (plane,) = [p for p in data.planes if p.name == "/device:TPU:0"]
    (line,) = [ln for ln in plane.lines if ln.name == name]
    return [(e.name, e.duration_ns) for e in line.events]


def test_the_reader_splits_the_real_tpu_trace_into_its_ops_compute_and_copies() -> None:
    trace = read(TRACE.read_bytes())
    assert trace.devices == [("tpu", 0)]
    assert trace.modules == frozenset({"jit__step"})
    assert trace.extent_ns() == (0, 644_005_154)
    (split,) = trace.split().values()
    # The figures jaxmon reads (picoseconds): compute 48.77 ms, copy 0.24 ms, no collective, the rest idle.
    assert split.compute == 48_773_022_658
    assert split.copy == 243_799_062
    assert split.collective == 0
    assert split.window == 644_005_154 * PS_PER_NS
    assert split.compute + split.copy + split.collective + split.idle == split.window

    ops = device_line("XLA Ops")
    assert len(ops) == 75
    ops_ns = sum(d for _, d in ops)
    copies_ns = sum(d for name, d in ops if name.startswith(("%copy-start", "%copy-done")))
    # jaxlib gives whole nanoseconds per event; jaxmon keeps picoseconds.
    assert (split.compute + split.copy) / PS_PER_NS == pytest.approx(ops_ns, rel=1e-5)
    assert split.copy / PS_PER_NS == pytest.approx(copies_ns, rel=2e-3)

    # Three steps of about 16.3 ms; the ops fill them (the device waited for nothing).
    steps = device_line("Steps")
    assert len(steps) == 3
    assert all(16.2e6 < d < 16.5e6 for _, d in steps)
    assert ops_ns == pytest.approx(sum(d for _, d in steps), rel=1e-3)


TWO_STEPS = TRACE.parent / "tpu-v5e-two-jit-step.xplane.pb"


def test_each_tpu_op_is_asked_for_by_its_program_and_instruction() -> None:
    """tests/fixtures/tpu-v5e-two-jit-step.xplane.pb: two jits of functions both named `step` (two `jit_step`
    programs), each called twice, and a `jit_add`, traced on a v5e chip. The names jaxmon asks for each op (module,
    program id, instruction: jaxmon.xla.classify.Namer) are, by jaxlib's own parser, the op's name up to ` = ` and the
    `XLA Modules` run whose span holds the op, `name(program_id)`: the two `jit_step` programs apart by their ids."""
    data = ProfileData.from_serialized_xspace(TWO_STEPS.read_bytes())
    (plane,) = [p for p in data.planes if p.name == "/device:TPU:0"]
    runs = []
    for line in plane.lines:
        if line.name == "XLA Modules":
            for e in line.events:
                name, program = e.name[:-1].split("(")
                runs.append((e.start_ns, e.start_ns + e.duration_ns, name, int(program)))
    want = set()
    for line in plane.lines:
        if line.name in ("XLA Ops", "Async XLA Ops"):
            for e in line.events:
                [(_, _, module, program)] = [r for r in runs if r[0] <= e.start_ns < r[1]]
                want.add((module, program, e.name.split(" = ")[0].lstrip("%")))
    assert {(m, p) for m, p, _ in want} == {(m, p) for _, _, m, p in runs}
    assert sorted(m for _, _, m, _ in runs).count("jit_step") == 4 and len({p for *_, p in runs}) == 3
    asked: set[tuple[str | None, int | None, str]] = set()

    def namer(module: str | None, program: int | None, name: str) -> str | None:
        asked.add((module, program, name))
        return None

    trace = read(TWO_STEPS.read_bytes(), namer)
    assert trace.modules == {"jit_step", "jit_add"}
    assert asked == want


def test_the_real_tpu_traces_runs_are_its_xla_modules_line_and_an_edge_inside_one_moves_to_a_steps_end() -> None:
    """The device's own runs of the step program are the `XLA Modules` line's events as jaxlib reads them. A window
    edge laid 1 ms into the second run (a waiter's late view of the first step's completion) moves back to the end
    of the first; one laid 1 ms before the second run's end (a date a little early) moves on to that end; an edge in
    the idle after the last run stays; one inside the trace's last run moves back."""
    data = ProfileData.from_serialized_xspace(TRACE.read_bytes())
    (plane,) = [p for p in data.planes if p.name == "/device:TPU:0"]
    (line,) = [ln for ln in plane.lines if ln.name == "XLA Modules"]
    truth = [(round(e.start_ns * PS_PER_NS), round((e.start_ns + e.duration_ns) * PS_PER_NS)) for e in line.events]
    trace = read(TRACE.read_bytes())
    runs = sorted(trace.runs[("tpu", 0)])
    assert len(runs) == 3 and [r[0] for r in runs] == pytest.approx([t[0] for t in truth], abs=2 * PS_PER_NS)
    assert [r[1] for r in runs] == pytest.approx([t[1] for t in truth], abs=2 * PS_PER_NS)  # jaxlib: whole ns
    first, second, third = runs
    ms = 1_000_000  # ns
    late = second[0] // PS_PER_NS + ms
    early = second[1] // PS_PER_NS - ms
    after = third[1] // PS_PER_NS + ms
    begin = max(first[0] // PS_PER_NS - 1, 0)
    (windows,) = trace.step_windows([(begin, late), (late, early), (early, after)]).values()
    assert windows == [(begin * PS_PER_NS, first[1]), (first[1], second[1]), (second[1], after * PS_PER_NS)]
    # An edge 1 ms before the trace's last run's end moves back: that end may be the trace's stop, not the step's.
    inside_last = third[1] // PS_PER_NS - ms
    (windows,) = trace.step_windows([(begin, inside_last)]).values()
    assert windows == [(begin * PS_PER_NS, second[1])]
