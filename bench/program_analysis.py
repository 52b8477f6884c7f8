"""What a new tracked program's communication and peak-memory analysis costs, and where it runs (issue 34).

    .venv/bin/python bench/program_analysis.py            # about 2 minutes on 2 cores

One process, jaxmon embedded (probe off), 8 CPU devices under `Mesh(("data", "model"), (4, 2))`: a training step of
an unrolled MLP of L layers (1024 wide, weights alternately sharded over `model` by columns and by rows, the batch
over `data`: all-reduces over `model` in the forward and backward passes, over `data` for the gradients), in
alternating rounds with a fresh function each time:

- off the training thread, on jaxmon's analysis thread (`JaxTraining.communication`), each part timed alone:
  `Compiled.as_text()` (and its size), `hlo.parse` + `summarize`, `memory_analysis()`; and the whole analysis as
  the thread runs it, from `Tracker.measure`'s hand-off to the program's `communication` being set;
- on the training thread, a new program's `Tracker.measure` (`measure_ms`: the cache-hit lowering, the cost
  analysis, the shardings for the mesh, the queueing; the analysis thread is woken afterwards, as the waiter does
  when it books the step), against what it did before issue 34's
  part (`before_ms`: the same lowering, cost analysis and device set, as JaxTraining.cost read them; the code is
  copied here), and the time the garbage collector ran inside each (`before_gc_ms`, `measure_gc_ms`: a full
  collection that the previous analysis's allocations brought forward lands in whatever call allocates next);
- the training thread's longest wait for the GIL while the analysis runs (`gil_gap_ms`: a thread that only
  sleeps 1 ms and notes the gaps; 1 ms + a switch interval or two is no wait at all).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import argparse
import gc
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import median, mlp_step, save
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxmon
from jaxmon import training
from jaxmon.sources.local.training import cost_numbers
from jaxmon.xla import hlo

WIDTH = 1024


def P(*axes: Any) -> PartitionSpec:
    return PartitionSpec(*axes)


def before(ops: Any, fn: Any, args: tuple[Any, ...]) -> None:
    """What Tracker.measure did on the training thread before: the avals, then JaxTraining.cost of the tree before
    issue 34."""
    avals, kwargs = ops.avals(args, {})
    compiled = fn.lower(*avals, **kwargs).compile()
    cost_numbers(compiled.cost_analysis())
    shardings = jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings))
    sorted({(str(d.platform), int(d.id)) for s in shardings for d in getattr(s, "device_set", ())})


class GcTime:
    """Seconds the collector ran (any thread) since `reset()`: a full collection that the analysis's allocations
    bring forward can land inside the next timed call."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start

    def reset(self) -> None:
        self.total = 0.0


def gil_gaps(stop: threading.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 48, 192])
    ap.add_argument(
        "--isolated",
        action="store_true",
        help="only before_ms against measure_ms, alternating fresh programs, with no analysis in the process",
    )
    args = ap.parse_args()
    exporter = jaxmon.start(0, workload="bench", collector={"probe": {"enabled": False}})
    tracker = training.current()
    assert tracker is not None
    ops: Any = tracker.ops
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    x = jax.device_put(jnp.ones((256, WIDTH)), NamedSharding(mesh, P("data")))
    results = []
    collector = GcTime()
    for layers in args.layers:
        specs = [P(None, "model") if i % 2 == 0 else P("model", None) for i in range(layers)]
        params = [jax.device_put(jnp.eye(WIDTH) * 0.5, NamedSharding(mesh, s)) for s in specs]
        rows: dict[str, list[float]] = {
            k: [] for k in ("before_ms", "before_gc_ms", "measure_ms", "measure_gc_ms", "analysis_ms", "gil_gap_ms")
        }
        parts: dict[str, list[float]] = {k: [] for k in ("as_text_ms", "parse_ms", "memory_analysis_ms")}
        text = ""
        if args.isolated:
            for _ in range(args.rounds):
                for kind in ("before_ms", "measure_ms"):
                    fn = jax.jit(mlp_step(layers))
                    with jax.set_mesh(mesh):
                        jax.block_until_ready(fn(params, x))
                        start = time.perf_counter()
                        if kind == "before_ms":
                            before(ops, fn, (params, x))
                        else:
                            tracker.measure(fn, (params, x), {})  # never kicked: no analysis runs
                        rows[kind].append((time.perf_counter() - start) * 1e3)
            row = {"layers": layers, "before_ms": rows["before_ms"], "measure_ms": rows["measure_ms"]}
            print(row, flush=True)
            results.append(row)
            continue
        for _ in range(args.rounds):
            fn = jax.jit(mlp_step(layers))
            with jax.set_mesh(mesh):
                jax.block_until_ready(fn(params, x))
                collector.reset()
                start = time.perf_counter()
                before(ops, fn, (params, x))
                rows["before_ms"].append((time.perf_counter() - start) * 1e3)
                rows["before_gc_ms"].append(collector.total * 1e3)
            fn = jax.jit(mlp_step(layers))
            with jax.set_mesh(mesh):
                jax.block_until_ready(fn(params, x))
                collector.reset()
                start = time.perf_counter()
                program = tracker.measure(fn, (params, x), {})
                rows["measure_ms"].append((time.perf_counter() - start) * 1e3)
                rows["measure_gc_ms"].append(collector.total * 1e3)
                stop, gaps = threading.Event(), [0.0]
                ticker = threading.Thread(target=gil_gaps, args=(stop, gaps))
                ticker.start()
                time.sleep(0.05)
                start = time.perf_counter()
                tracker._analyzer.kick()  # what the waiter does when it books the program's step
                while program.communication is None:
                    time.sleep(0.0005)
                rows["analysis_ms"].append((time.perf_counter() - start) * 1e3)
                stop.set()
                ticker.join()
                rows["gil_gap_ms"].append(max(gaps) * 1e3)
                compiled = ops.compiled(fn, ops.avals((params, x), {}))
            start = time.perf_counter()
            text = compiled.compiled.as_text()
            parts["as_text_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            summary = hlo.summarize(hlo.parse(text), compiled.mesh, compiled.assignment)
            parts["parse_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            compiled.compiled.memory_analysis()
            parts["memory_analysis_ms"].append((time.perf_counter() - start) * 1e3)
        row = {
            "layers": layers,
            "hlo_bytes": len(text),
            "hlo_lines": len(text.splitlines()),
            "collectives": len(hlo.parse(text).collectives),
            "bytes_per_step_by_op_axes": {f"{op} [{','.join(axes)}]": n for (op, axes), n in summary.items()},
            **{k: median(v) for k, v in {**rows, **parts}.items()},
            "rounds": args.rounds,
        }
        print(row, flush=True)
        results.append(row)
    exporter.stop()
    name = "program_analysis_isolated" if args.isolated else "program_analysis"
    save(name, {"programs": results, "load_average": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
