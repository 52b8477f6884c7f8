"""What jaxmon.step() costs above its floors, side by side in one loop: Python's call floor, and a compiled
prototype of its common path (bench/step_floor.c, built here with the system's C compiler).

    .venv/bin/python bench/step_floor.py                        # 6 rounds of 3000 steps of ~0.3 ms per variant
    .venv/bin/python bench/step_floor.py --rounds 8 --k 6 --out bench/results/step_floor.json
    PYTHONPATH=DIR .venv/bin/python bench/step_floor.py        # another tree's jaxmon/ (`git archive REV jaxmon`)

One process, one XLA:CPU device, the docs' loop: a jitted step donating its state (`k` tanh(state @ w + x) updates
of a 128 x 128 state), returning it and a loss, waiting for the step before last. Each round runs every variant
for `--steps` steps, in turn (the order reversed every other round); each variant's figure is the median over the
rounds of its mean per step:

- `plain`: the jitted call alone.
- `jaxmon`: `jaxmon.track(step)` and `jaxmon.step(n, loss, examples=, tokens=, model_flops=)`, jaxmon started at
  its defaults (its waiter books the steps; `--every` sets the sampled traces' interval, 0: off).
- `floor`: the jitted call, then a Python function of step()'s signature that does nothing.
- `compiled`: the prototype's wrapper and step(): the same checks on the same kinds of objects (a deque, a waiter's
  and a sampler's attributes), in C; a thread empties its deque every 50 ms.

`step_us` is the wall time of the step() call (time.perf_counter_ns around it), `call_us` of the (tracked) jitted
call: noisy, a difference of tens of microseconds between variants moves by a few from round to round here.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = Path(__file__).resolve().parent
D = 128
FIGURES = {"examples": 32, "tokens": 32 * 128, "model_flops": 6.0e9}


def build() -> Any:
    """bench/step_floor.c compiled into a temporary directory and imported."""
    out = Path(tempfile.mkdtemp(prefix="step_floor_")) / ("step_floor_c" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = os.environ.get("CC", "cc")
    include = sysconfig.get_paths()["include"]
    subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(HERE / "step_floor.c"), "-o", str(out)],
                   check=True)  # fmt: skip
    spec = importlib.util.spec_from_file_location("step_floor_c", out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=3000, help="steps per variant and round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--k", type=int, default=6, help="tanh updates a step (6: about 0.3 ms here)")
    ap.add_argument("--every", type=int, default=1000, help="jaxmon's collector.training.profile.every (0: off)")
    ap.add_argument("--out", help="JSON results (default: printed only)")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import jaxmon

    native = build()
    w = jnp.eye(D) * 0.5

    def body(state: Any, x: Any) -> tuple[Any, Any]:
        for _ in range(args.k):
            state = jnp.tanh(state @ w + x)
        return state, jnp.sum(state)

    f = jax.jit(body, donate_argnums=0)
    x = jnp.ones((D, D))
    jaxmon.start(0, training={"profile": {"every": args.every}})
    tracked = jaxmon.track(f)

    # The compiled prototype's objects: a deque emptied by a thread, a waiter's and a sampler's attributes.
    handed: collections.deque[Any] = collections.deque()
    waiter = type("Waiter", (), {})()
    waiter.want, waiter.resumed_after, waiter.taken = False, float("inf"), 0
    blocks = type("Blocks", (), {"__slots__": ("retry",)})()
    blocks.retry = None
    sampler = type("Sampler", (), {})()
    sampler.modulus, sampler.watch, sampler.blocks = args.every, -1, blocks
    slow_calls = [0]

    def slow(n: int, *ready: Any, examples: Any = None, tokens: Any = None, model_flops: Any = None) -> None:
        slow_calls[0] += 1  # the first step, and the first after a round of another variant: the base to follow
        compiled.last, compiled.examples, compiled.tokens, compiled.model_flops = n, examples, tokens, model_flops

    compiled = native.Step(handed, waiter, sampler, (), slow, 1 << 30)
    once = ("program",)
    compiled.programs, compiled.due = once, float("inf")
    compiled_tracked = native.Tracked(f, once, f._cache_size, compiled)
    stop = threading.Event()

    def empty() -> None:
        while not stop.wait(0.05):
            while handed:
                handed.popleft()

    threading.Thread(target=empty, daemon=True).start()

    def floor(n: Any, *ready: Any, examples: Any = None, tokens: Any = None, model_flops: Any = None) -> None:
        return None

    variants: dict[str, tuple[Any, Any]] = {
        "plain": (f, None),
        "jaxmon": (tracked, jaxmon.step),
        "floor": (f, floor),
        "compiled": (compiled_tracked, compiled),
    }
    state = {"x": jnp.zeros((D, D)), "n": 1}

    def run(kind: str, steps: int) -> tuple[float, float, float]:
        fn, step = variants[kind]
        clock = time.perf_counter_ns
        st, n0 = state["x"], state["n"]
        losses: collections.deque[Any] = collections.deque(maxlen=2)
        call_ns = step_ns = 0
        start = time.perf_counter()
        for n in range(n0, n0 + steps):
            if len(losses) == 2:
                losses[0].block_until_ready()
            a = clock()
            st, loss = fn(st, x)
            b = clock()
            if step is not None:
                step(n, loss, **FIGURES)
            c = clock()
            call_ns += b - a
            step_ns += c - b
            losses.append(loss)
        st.block_until_ready()
        wall = time.perf_counter() - start
        state["x"], state["n"] = st, n0 + steps
        return wall / steps * 1e3, call_ns / steps / 1e3, step_ns / steps / 1e3

    kinds = list(variants)
    for kind in kinds:  # warm-up: compilations, the tracked program's cost, the waiter's first looks
        run(kind, 500)
    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            rows[kind].append(run(kind, args.steps))
    stop.set()
    result: dict[str, Any] = {
        "benchmark": "step_floor",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "jaxmon": str(Path(jaxmon.__file__).parent),
        "loadavg_at_start": os.getloadavg(),
        "args": vars(args),
        "compiled_slow_calls": slow_calls[0],
        "variants": {},
    }
    for kind in kinds:
        ms, call, step = zip(*rows[kind], strict=True)
        result["variants"][kind] = {
            "step_ms": statistics.median(ms),
            "call_us": statistics.median(call),
            "step_us": statistics.median(step),
            "step_us_rounds": [round(v, 3) for v in step],
        }
        print(f"{kind:9s} step {statistics.median(ms):.4f} ms  call {statistics.median(call):6.2f} µs  "
              f"step() {statistics.median(step):5.2f} µs  (rounds {', '.join(f'{v:.2f}' for v in step)})")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print("written", args.out)


if __name__ == "__main__":
    sys.exit(main())
