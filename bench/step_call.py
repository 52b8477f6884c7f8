"""What one `jaxmon.step()` call costs the training thread, with a figure that is a device scalar still being computed
and with Python numbers, side by side; and how fast jaxmon's waiter catches up on steps that are done already
(issue 33).

    .venv/bin/python bench/step_call.py                    # about a minute on 2 cores
    .venv/bin/python bench/step_call.py --tree DIR         # the same against another tree's jaxmon/ (DIR:
                                                           #   `git archive REV jaxmon | tar -x -C DIR`)

One process, jaxmon embedded (probe off), 8 CPU devices. A loop dispatches a step (a chain of eight 256² matmuls)
and hands it to `jaxmon.step(n, loss, examples=..., tokens=..., model_flops=...)`, at most two steps
in flight (it waits for step n-2, as the docs' loops do). In `python` rounds the figures are Python numbers; in
`device` rounds `tokens` is a device scalar computed from the step's output, so it is not ready when step() is
called: the batch's real token count, as a trainer computes it. Rounds alternate (python, device, device, python,
...). Only the step() call is timed (perf_counter around it): `step_us` is the median over every call of a kind,
with its p90. Before issue 33 step() converted the scalar at once, waiting for the device.

The catch-up part: the waiter is held back behind a first step of about 0.3 s while the loop hands it K more steps
whose ready arrays are all computed already; then the training thread spins in Python (holding the GIL but for the
interpreter's switch interval) until the waiter has booked them all. `catchup_ms` is the time from the waiter's
booking of the first of the K to the last (median of the rounds): how fast a waiter that fell behind catches up
while the loop keeps the GIL busy. Each blocking call the waiter makes gives up
the GIL and must take it back from the spinning thread (up to a 5 ms switch interval).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import argparse
import statistics
import sys
import time
from typing import Any

from common import median, save

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--steps", type=int, default=150, help="steps per round of the step() timing")
ap.add_argument("--catchup", type=int, default=200, help="steps the waiter catches up on per round")
ap.add_argument("--catchup-rounds", type=int, default=5)
ap.add_argument("--tree", help="a directory holding another tree's jaxmon/ package, measured instead of this one")
ap.add_argument("--name", default="step_call")
args = ap.parse_args()
if args.tree:
    sys.path.insert(0, os.path.abspath(args.tree))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxmon  # noqa: E402
from jaxmon import training  # noqa: E402

SIZE = 256


def step_fn() -> Any:
    return jax.jit(lambda x: jax.lax.fori_loop(0, 8, lambda _, c: jnp.tanh(c @ c) / SIZE, x))


def timed_round(f: Any, x: jax.Array, device: bool, first: int) -> tuple[list[float], jax.Array]:
    """One round of `args.steps` steps; the step() call times in microseconds."""
    count = jax.jit(lambda y: jnp.sum(y > -1.0))  # every element: SIZE² tokens, computed after the step
    calls, outs = [], []
    for i in range(args.steps):
        x = f(x)
        tokens: Any = count(x) if device else SIZE * SIZE
        start = time.perf_counter()
        jaxmon.step(first + i, x, examples=8, tokens=tokens, model_flops=1e9)
        calls.append((time.perf_counter() - start) * 1e6)
        outs.append(x)
        if len(outs) > 2:
            outs.pop(0).block_until_ready()  # two steps in flight at most
    x.block_until_ready()
    return calls, x


def settle(tracker: Any, steps: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (r := tracker.reading()) is None or r.steps_total < steps:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{steps} steps not booked")
        time.sleep(0.01)


def catch_up(tracker: Any, first: int, booked: int) -> float:
    """Milliseconds the waiter takes to book K steps that are done already, behind a slow first step, while the loop
    spins in Python: from its booking of the first of them to the last (the times the waiter's own bookkeeping
    call is entered, recorded by a wrapper around it)."""
    slow = jax.jit(lambda x: jax.lax.fori_loop(0, 40, lambda _, c: jnp.tanh(c @ c) / 768 + 1, x))
    head = jnp.ones((768, 768))
    slow(head).block_until_ready()  # compiled
    done = [jnp.ones(()) + i for i in range(args.catchup)]
    jax.block_until_ready(done)
    times: list[float] = []
    complete = tracker._complete

    def timed(*a: Any, **k: Any) -> Any:
        times.append(time.perf_counter())
        return complete(*a, **k)

    tracker._complete = timed
    try:
        jaxmon.step(first, slow(head))  # the waiter waits here while the K steps queue behind it
        for i, a in enumerate(done):
            jaxmon.step(first + 1 + i, a)
        spin = 0
        deadline = time.monotonic() + 120
        while len(times) < 1 + args.catchup and time.monotonic() < deadline:
            for _ in range(1000):  # the training thread busy in Python
                spin += 1
    finally:
        tracker._complete = complete
    assert len(times) == 1 + args.catchup, "the waiter did not catch up"
    return (times[-1] - times[1]) * 1e3


def main() -> None:
    exporter = jaxmon.start(0, workload="bench", collector={"probe": {"enabled": False}})
    tracker = training.current()
    assert tracker is not None
    f = step_fn()
    x = f(jnp.ones((SIZE, SIZE))).block_until_ready()
    _, x = timed_round(f, x, True, 0)  # compile and warm up both kinds
    _, x = timed_round(f, x, False, args.steps)
    number = 2 * args.steps
    calls: dict[str, list[float]] = {"python": [], "device": []}
    round_medians: dict[str, list[float]] = {"python": [], "device": []}
    for r in range(args.rounds):
        for kind in ("python", "device") if r % 2 == 0 else ("device", "python"):
            times, x = timed_round(f, x, kind == "device", number)
            number += args.steps
            calls[kind] += times
            round_medians[kind].append(median(times))
    settle(tracker, number)
    rates = []
    for _ in range(args.catchup_rounds):
        rates.append(catch_up(tracker, number, number))
        number += 1 + args.catchup
        settle(tracker, number)
    reading = tracker.reading()
    exporter.stop()

    def p90(values: list[float]) -> float:
        return float(statistics.quantiles(values, n=10)[-1])

    save(
        args.name,
        {
            "tree": os.path.abspath(args.tree) if args.tree else "this",
            "step_us": {k: median(v) for k, v in calls.items()},
            "step_p90_us": {k: p90(v) for k, v in calls.items()},
            "round_medians_us": round_medians,
            "calls": {k: len(v) for k, v in calls.items()},
            "catchup_ms": median(rates),
            "catchup_us_per_step": median(rates) * 1e3 / args.catchup,
            "catchup_rounds_ms": rates,
            "catchup_steps": args.catchup,
            "steps_total": reading.steps_total if reading else None,
            "problems": dict(reading.problems) if reading else None,
        },
    )


if __name__ == "__main__":
    main()
