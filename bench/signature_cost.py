"""What a tracked function's call signature costs the training thread since its `_committed` read went through
jaxmon/sources/local/private.py (issue 41), side by side with the direct read it replaced.

    .venv/bin/python bench/signature_cost.py            # a few seconds

`JaxTraining.signature()` runs on every call of a `jaxmon.track`ed function, over every leaf of its arguments. A
(before): the expression of issue 40's tree, `getattr(x, "sharding") if getattr(x, "_committed", False)`, reproduced
here. B (after): `JaxTraining.signature()` as it is. Arguments: a parameter tree of `--leaves` committed jax arrays
and one NumPy batch (a leaf without `_committed`, which pays for the guard's call). Rounds alternate A and B; each
round times `--calls` calls; the figure is the median per call over the rounds, in microseconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import argparse
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import median, save

from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
ap.add_argument("--leaves", type=int, default=200)
ap.add_argument("--calls", type=int, default=2000)
ap.add_argument("--rounds", type=int, default=10)
args = ap.parse_args()

ops = JaxTraining(LocalSource(sidecar_defaults=False))
device = jax.devices()[0]
params = {f"w{i}": jax.device_put(jnp.ones((4,)), device) for i in range(args.leaves)}
call = ((params, np.ones((8, 4))), {})


def before(a: tuple[Any, ...], kw: dict[str, Any]) -> Hashable:
    leaves, treedef = jax.tree_util.tree_flatten((a, dict(kw)))
    return treedef, tuple(
        (type(x), getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "weak_type", None),
         getattr(x, "sharding", None) if getattr(x, "_committed", False) else None)
        if hasattr(x, "shape") else x
        for x in leaves
    )  # fmt: skip


assert before(*call) == ops.signature(*call)  # the same key: only the cost may differ


def per_call(fn: Callable[..., Hashable]) -> float:
    start = time.perf_counter()
    for _ in range(args.calls):
        fn(*call)
    return (time.perf_counter() - start) / args.calls * 1e6


per_call(before)
per_call(ops.signature)
a: list[float] = []
b: list[float] = []
for r in range(args.rounds):
    for side in "ab" if r % 2 == 0 else "ba":
        (a if side == "a" else b).append(per_call(before if side == "a" else ops.signature))
result = {
    "leaves": args.leaves + 1,
    "calls": args.calls,
    "rounds": args.rounds,
    "before_us": round(median(a), 2),
    "after_us": round(median(b), 2),
    "before_rounds_us": [round(v, 2) for v in a],
    "after_rounds_us": [round(v, 2) for v in b],
}
print(result)
save("signature_cost", result)
