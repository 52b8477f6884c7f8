"""What reading a large sampled trace costs the training thread: on jaxmon's thread (the GIL shared) or in a child.

    .venv/bin/python bench/trace_read_gil.py [--dispatches 30000] [--out FILE]

A real trace on one XLA:CPU device: a profiler session over `--dispatches` calls of a tiny jitted function (about
10 MB of XSpace for 30 000). Then jaxmon.training.trace_split.split() reads and splits it on a thread, once with the
in-process limit above the trace's size (read on that thread) and once with it at 0 (read by a child Python), while
the main thread counts loop turns: its pace during each read, against its pace beside a thread that only sleeps,
is what a training thread that dispatches back to back keeps. Output: JSON at `--out` (default
bench/results/trace_read_gil.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pace(work: Any) -> tuple[float, float, Any]:
    """The main thread's loop turns a second while `work()` runs on another thread, its seconds, and its result."""
    out: dict[str, Any] = {}

    def run() -> None:
        out["result"] = work()

    thread = threading.Thread(target=run)
    turns, start = 0, time.perf_counter()
    thread.start()
    while thread.is_alive():
        turns += 1
    elapsed = time.perf_counter() - start
    return turns / elapsed, elapsed, out.get("result")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dispatches", type=int, default=30000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "trace_read_gil.json"))
    args = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    from jaxmon.sources.local import private
    from jaxmon.training.trace_links import Catalog
    from jaxmon.training.trace_split import split

    _, options_type, session_type = private.profiler_internals()
    f = jax.jit(lambda x: x + 1)
    x = f(jnp.ones(4)).block_until_ready()
    options = options_type()
    options.python_tracer_level = 0
    options.host_tracer_level = 2  # as a sample's
    session = session_type(options)
    t0 = time.time_ns()
    for _ in range(args.dispatches):
        x = f(x)
    x.block_until_ready()
    t1 = time.time_ns()
    data = bytes(session.stop())
    alone, _, _ = pace(lambda: time.sleep(1.0))
    result: dict[str, Any] = {
        "benchmark": "trace_read_gil",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "loadavg_at_start": [round(v, 2) for v in os.getloadavg()],
        "trace_bytes": len(data),
        "alone_turns_per_s": alone,
    }
    for name, limit in (("thread", len(data) + 1), ("child", 0)):
        rate, seconds, got = pace(lambda limit=limit: split(data, Catalog(), [(t0, t1)], limit=limit))
        result[name] = {"seconds": seconds, "main_pace": rate / alone, "devices": len(got or {})}
        print(f"{name}: read in {seconds:.2f} s; the main thread at {100 * rate / alone:.0f} % of its pace")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
