"""The cost of attributing a sampled trace's collectives to their axes and links (issue 40), side by side.

    JAX_NUM_CPU_DEVICES=8 .venv/bin/python bench/trace_attribution.py      # about a minute

The loop of bench/profile_sampling.py (a 4-layer MLP under Mesh(("data", "model"), (4, 2)) on the 8 CPU devices, its
gradients all-reduced over `data`). One sample's trace (2 steps) is taken once; then, alternating, --rounds times:

- before: what the sampler's thread did with it before issue 40: `read()` with the collective instructions named by
  op, and issue 34's split (kept in this script) of each step's window, per op;
- after: `read()` with the instructions named by program and place (jaxmon.training.trace_links.Catalog: each event
  looked up by its program's id and its instruction), today's split (exposed time and events per instruction too),
  and the sums per (op, axes, link) with bytes (PlacedTotals).

Both run on the sampler's thread, once per sample: the extra time against a sample's interval (collector.training
.profile.every steps) is the attribution's share of a core; the training thread does nothing more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax

from bench.profile_sampling import PROFILE_EVERY, RESULTS, Loop
from jaxmon.sources.local.profiler import JaxProfiler
from jaxmon.sources.local.training import module_id
from jaxmon.training.links import DeviceTopology, place
from jaxmon.training.trace_links import Catalog, PlacedTotals, ProgramPlaces
from jaxmon.xla import hlo
from jaxmon.xla.intervals import COLLECTIVE, COMPUTE, COPY, Segment, union_length
from jaxmon.xla.profile import read


def split_before(segments: Iterable[Segment], t0: int, t1: int) -> tuple[list[int], dict[str, int]]:
    """Issue 34's split (jaxmon/profile/intervals.py before issue 40): parts and each op's union time."""
    points: list[tuple[int, int, int]] = []
    by_op: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for start, end, cls, op in segments:
        start, end = max(start, t0), min(end, t1)
        if end <= start:
            continue
        points.append((start, 1, cls))
        points.append((end, -1, cls))
        if cls == COLLECTIVE:
            by_op[op].append((start, end))
    points.sort()
    running = [0, 0, 0]
    parts = [0, 0, 0, 0]
    prev = t0
    for t, delta, cls in points:
        if t > prev:
            parts[
                COMPUTE if running[COMPUTE] else COLLECTIVE if running[COLLECTIVE] else COPY if running[COPY] else 3
            ] += t - prev
            prev = t
        running[cls] += delta
    parts[3] += t1 - prev
    return parts, {op: union_length(iv) for op, iv in by_op.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    loop = Loop()
    compiled = loop.step.lower(loop.layers, loop.x).compile()
    text = compiled.as_text()
    program = hlo.parse(text)
    mesh = hlo.MeshLayout(("data", "model"), (4, 2), tuple(d.id for d in jax.devices()[:8]))
    placed = place(program, mesh, None, {d.id: DeviceTopology(d.id, "cpu", 0) for d in jax.devices()})
    names = {c.name: c.op for c in program.collectives}
    places = {n: (*placed.places[n], placed.sizes[n]) for n in placed.places}
    catalog = Catalog([ProgramPlaces(program.name, module_id(compiled), places)])
    profiler = JaxProfiler(jax)
    loop.run(4, sync=True)
    profiler.start(python=False)
    t_start = time.time_ns()
    loop.run(2, sync=True)
    t_end = time.time_ns()
    data = profiler.stop()
    before: list[float] = []
    after: list[float] = []

    def run_before() -> float:
        t0 = time.perf_counter()
        trace = read(data, names)
        window = (trace.trace_ns(t_start) * 1000, trace.trace_ns(t_end) * 1000)
        for segments in trace.segments.values():
            split_before(segments, *window)
        return time.perf_counter() - t0

    def run_after() -> float:
        t0 = time.perf_counter()
        trace = read(data, catalog)
        totals = {device: PlacedTotals() for device in trace.segments}
        for device, s in trace.split(trace.trace_ns(t_start), trace.trace_ns(t_end)).items():
            totals[device].add(s, 1e-12)
        return time.perf_counter() - t0

    for n in range(args.rounds):  # alternating, the order reversed every other round
        if n % 2:
            after.append(run_after())
            before.append(run_before())
        else:
            before.append(run_before())
            after.append(run_after())
    trace = read(data, catalog)  # what the attribution found: every event placed, bytes per place
    found = PlacedTotals()
    for s in trace.split(trace.trace_ns(t_start), trace.trace_ns(t_end)).values():
        found.add(s, 1e-12)
    step = statistics.median(loop.run(20)[2:])
    extra = statistics.median(after) - statistics.median(before)
    result = {
        "trace_bytes": len(data),
        "places": sorted({p[:3] for p in places.values()}),
        "placed_bytes": {",".join(k): v for k, v in found.bytes.items()},
        "unplaced_events": found.unplaced,
        "before_ms": statistics.median(before) * 1e3,
        "after_ms": statistics.median(after) * 1e3,
        "extra_ms": extra * 1e3,
        "step_s": step,
        "share_at_default_every": extra / (PROFILE_EVERY * step),
        "rounds": args.rounds,
        "load": os.getloadavg(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trace_attribution.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
