"""Keras 3's model.fit() on the JAX backend with jaxmon.keras.JaxmonCallback: jaxmon's step durations against the
completions Keras's own callbacks see, fit after fit (issue 49: Keras's fit read 0.45 s of 0.88 in CI).

    KERAS_BACKEND=jax python bench/keras_fit_dates.py [--fits 25] [--epochs 2] [--steps 15] [--out results.json]

Each fit's truth is a plain callback's on_train_batch_end times (Keras calls it once a batch's logs are computed,
on its executor threads): the first and the last batch's. jaxmon's is the summed durations of the fit's steps from
the first one's completion, from the steps the waiter booked (its runs' completions, read by wrapping its book).
Prints, per fit, both and their difference; writes them all to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import jaxmon
from jaxmon import training
from tests.workloads.keras_fit import BATCH, WIDTH, Timing, model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fits", type=int, default=25)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from jaxmon.keras import JaxmonCallback

    jaxmon.start(0, workload="keras-dates", poll={"interval": 0.2}, collector={"probe": {"enabled": False}})
    tracker = training.current()
    assert tracker is not None
    completions: list[float] = []
    book = tracker.waiter._book

    def booking(runs: list[Any], *rest: Any) -> None:
        for run in runs:
            completions.extend(run.done or [])
        book(runs, *rest)

    tracker.waiter._book = booking  # type: ignore[method-assign]
    m = model()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * BATCH, WIDTH), dtype=np.float32)
    m.fit(x, x[:, :1], batch_size=BATCH, epochs=1, verbose=0)  # compiled before the timed fits
    fits = []
    for fit in range(args.fits):
        completions.clear()
        timing = Timing()
        m.fit(x, x[:, :1], batch_size=BATCH, epochs=args.epochs, callbacks=[JaxmonCallback(), timing], verbose=0)
        tracker.flush(10)
        done = [timing.done[i] for i in range(len(timing.done))]
        keras_seconds, jaxmon_seconds = done[-1] - done[0], completions[-1] - completions[0]
        fits.append({"keras_seconds": keras_seconds, "jaxmon_seconds": jaxmon_seconds})
        print(f"fit {fit}: Keras {keras_seconds:.3f} s, jaxmon {jaxmon_seconds:.3f} s, "
              f"{1e3 * (jaxmon_seconds - keras_seconds):+.1f} ms", flush=True)  # fmt: skip
    diffs = sorted(abs(f["jaxmon_seconds"] - f["keras_seconds"]) for f in fits)
    print(f"|difference|: median {1e3 * diffs[len(diffs) // 2]:.1f} ms, most {1e3 * diffs[-1]:.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps({"fits": fits}, indent=1))
    jaxmon.stop()


if __name__ == "__main__":
    main()
