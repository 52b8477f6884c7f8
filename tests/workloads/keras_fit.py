"""A Keras 3 model trained by `model.fit()` on the JAX backend, run as a real child process by tests/e2e/test_keras.py.

Usage: keras_fit.py [--port P] [--workload NAME]. jaxmon.start() serves it (probe off, 0.2 s polls). Commands on stdin,
one per line; each is answered on stdout with `OK <json>`:
  fit EPOCHS STEPS WITH_JAXMON  model.fit() of EPOCHS epochs of STEPS batches, with jaxmon.keras.JaxmonCallback when
                                WITH_JAXMON is 1; answer with Keras's own view of it, from a plain callback of this
                                script (async_safe, as jaxmon's: Keras dispatches asynchronously either way): when each
                                batch was handed to the step (on_train_batch_begin, the training thread) and when its
                                logs were computed (on_train_batch_end, which Keras calls once they are), the most
                                batches handed and not yet computed at any on_train_batch_begin (how far the host ran
                                ahead of the device), and the fit's wall time
  exit
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np

import jaxmon
from jaxmon.keras import JaxmonCallback
from jaxmon.logsetup import configure_logging
from tests.workloads.protocol import answer

BATCH = 128
WIDTH = 1024


class Timing(keras.callbacks.Callback):  # type: ignore[misc]  # keras ships no types
    """Keras's own view of each batch: handed (training thread) and computed (its logs, on Keras's executor)."""

    async_safe = True

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.handed: list[float] = []
        self.done: dict[int, float] = {}
        self.ahead = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        with self.lock:
            self.ahead = max(self.ahead, len(self.handed) - len(self.done))
            self.handed.append(time.monotonic())

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        now = time.monotonic()  # the logs are Python floats: Keras waited for them on this executor thread
        with self.lock:
            self.done[len(self.done)] = now


def model() -> keras.Model:
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((WIDTH,)),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    m.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return m


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--workload", default="keras")
    args = ap.parse_args()
    configure_logging("warning", "json")
    exporter = jaxmon.start(
        args.port, workload=args.workload, poll={"interval": 0.2}, collector={"probe": {"enabled": False}}
    )
    answer(url=exporter.url, pid=os.getpid(), backend=keras.backend.backend())
    m = model()
    rng = np.random.default_rng(0)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            break
        if words[0] == "fit":
            epochs, steps, with_jaxmon = int(words[1]), int(words[2]), words[3] == "1"
            x = rng.standard_normal((steps * BATCH, WIDTH), dtype=np.float32)
            y = x[:, :1] * 2.0
            timing = Timing()
            callbacks = [JaxmonCallback(), timing] if with_jaxmon else [timing]
            start = time.monotonic()
            m.fit(x, y, batch_size=BATCH, epochs=epochs, callbacks=callbacks, verbose=0, shuffle=False)
            wall = time.monotonic() - start
            done = [timing.done[i] for i in range(len(timing.done))]
            answer(handed=timing.handed, done=done, ahead=timing.ahead, wall=wall, batch=BATCH)
    exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
