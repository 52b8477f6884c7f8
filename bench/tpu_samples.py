"""Why a sampled trace is taken or fails, sample by sample, on a real accelerator (bench/tpu.py's bf16 MLP loop).

    python bench/tpu_samples.py OUT.json [--steps 400] [--every 40] [--ahead 2] [--dry-run]

For each sample the sampler started: its block, the profiler's start (ask to running), the lead, the result, the
completions jaxmon booked for the block's steps and the one before, and the loop's own completion of each (its wait
on the step, `ahead` steps behind the host), on the tracker's clock. Wraps jaxmon's own Sampler methods (a bench,
not a test): no JAX or profiler function is replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.tpu import mlp  # (the repository on the path first: bench/ runs outside pytest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=40)
    ap.add_argument("--ahead", type=int, default=2, help="steps in flight before the loop waits for one")
    ap.add_argument("--dry-run", action="store_true", help="small sizes on whatever devices JAX has")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import jaxmon
    from jaxmon.training import sampler as sampler_module

    samples: list[dict[str, Any]] = []
    original = sampler_module.Sampler._sample

    def sample(self: Any, n0: int, asked: float) -> None:
        before = dict(self._results)
        record: dict[str, Any] = {"block": n0, "asked": asked}
        lead_after = self._lead_after

        def noted(start: float) -> None:
            record["start_seconds"] = start
            lead_after(start)
            record["lead"] = self.lead

        self._lead_after = noted
        try:
            original(self, n0, asked)
        finally:
            del self._lead_after
        record["result"] = [k for k, v in self._results.items() if v != before.get(k)]
        record["booked"] = {k: v for k, v in self._done if n0 - 2 <= k <= n0 + self.config.steps}
        samples.append(record)

    sampler_module.Sampler._sample = sample  # type: ignore[method-assign]

    batch, width, layers = (256, 256, 4) if args.dry_run else (8192, 4096, 4)
    training: dict[str, Any] = {"profile": {"every": args.every, "steps": 2, "min_seconds": 0}}
    if args.dry_run:
        training["peak_flops"] = 1e11
    exporter = jaxmon.start(workload="tpu-samples", collector={"training": training})
    tracker = jaxmon.training.current()
    assert tracker is not None
    clock = tracker.now

    jitted, params, x = mlp(jax, jnp, batch, width, layers)
    tracked = jaxmon.track(jitted)
    params, value = tracked(params, x)
    value.block_until_ready()
    pending: list[tuple[int, Any]] = []
    handed: dict[int, float] = {}
    done: dict[int, float] = {}
    for n in range(1, args.steps + 1):
        params, value = tracked(params, x)
        jaxmon.step(n, value)
        handed[n] = clock()
        pending.append((n, value))
        if len(pending) > args.ahead:
            k, v = pending.pop(0)
            v.block_until_ready()
            done[k] = clock()
    for k, v in pending:
        v.block_until_ready()
        done[k] = clock()
    time.sleep(3.0)
    reading = tracker.sampler.reading()
    exporter.stop()
    for record in samples:
        n0 = record["block"]
        record["loop"] = {k: done.get(k) for k in range(n0 - 2, n0 + 2)}
        record["handed"] = {k: handed.get(k) for k in range(n0 - 6, n0 + 2)}
    steps = sorted(done)
    mean = (done[steps[-1]] - done[steps[0]]) / (len(steps) - 1)
    result = {
        "platform": jax.devices()[0].platform,
        "step_seconds": mean,
        "results": dict(reading.results) if reading is not None else None,
        "samples": samples,
    }
    args.out.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    print(json.dumps({"step_seconds": mean, "results": result["results"]}))
    for r in samples:
        n0 = r["block"]
        loop_prev, booked_prev = r["loop"].get(n0 - 1), r["booked"].get(n0 - 1)
        print(
            f"block {n0}: {r['result']} start {r.get('start_seconds', 0) * 1e3:.1f} ms lead {r.get('lead')} "
            f"step {n0 - 1} done (loop) {(loop_prev or 0) - r['asked']:.4f} "
            f"booked {(booked_prev or 0) - r['asked']:.4f} after the ask",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
