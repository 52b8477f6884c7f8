"""A sampled trace ends with its block's last step, not at the waiter's next look: where steps are short the waiter
looks once per hundreds of them (waiter.LOOK_STEPS), and every step more in the trace is events its stop and parse pay
for (on a TPU v5e chip, 0.36 ms steps of thousands of ops made traces of tens of megabytes). Here a
real loop of 3,300 steps; the sampler's own ask for that look is tests/unit/training/test_sampler_stop.py's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.training import JaxTraining
from jaxmon.training.handed import SamplerConfig
from jaxmon.training.sampler import Sampler
from jaxmon.training.tracker import Tracker, TrackerConfig
from jaxmon.training.waiter import LOOK
from tests.helpers import wait_until

EVERY = 1000
BLOCKS = 3
# The trace must stop within this many steps of the loop's after the block's last one: about 30 ms of its steps
# here, where a look comes every 500 of them (a stop at the next look: 250 steps late on average).
SLACK = 100


class _Recording:
    """The real profiler, noting at each stop the step the loop last handed."""

    def __init__(self, real: Any, handed: list[int], stops: list[int]) -> None:
        self._real, self._handed, self.stops = real, handed, stops

    def start(self, python: bool) -> None:
        self._real.start(python)

    def stop(self) -> bytes:
        self.stops.append(self._handed[0])
        return bytes(self._real.stop())

    def export(self, directory: Path) -> None:
        self._real.export(directory)

    def devices(self) -> Mapping[tuple[str, int], tuple[str, int]]:
        return dict(self._real.devices())


class _Ops(JaxTraining):
    def __init__(self, source: LocalSource, handed: list[int], stops: list[int]) -> None:
        super().__init__(source)
        self._handed, self._stops = handed, stops

    def profiler(self) -> Any:
        return _Recording(super().profiler(), self._handed, self._stops)


def test_a_sampled_trace_stops_with_its_blocks_last_step_in_a_fast_loop() -> None:
    """Steps of a fraction of a millisecond, the loop waiting for the step before last (the docs' loop): each of three
    blocks' traces stops within SLACK steps of the block's last step."""
    handed: list[int] = [0]
    stops: list[int] = []
    f = jax.jit(lambda x: (jnp.tanh(x @ x) / 256, jnp.mean(x)), donate_argnums=0)
    x, loss = f(jnp.ones((256, 256), jnp.float32))
    loss.block_until_ready()
    tracker = Tracker(
        _Ops(LocalSource(sidecar_defaults=False), handed, stops), TrackerConfig(profile=SamplerConfig(EVERY, 2))
    )
    every = []
    try:
        pending: list[jax.Array] = []
        for n in range(1, EVERY * BLOCKS + 300):
            handed[0] = n
            x, loss = f(x)
            tracker.step(n, loss)
            pending.append(loss)
            if len(pending) > 2:
                pending.pop(0).block_until_ready()
            if n % EVERY == 0:
                every.append(tracker.waiter.every)
        sampler = tracker.sampler
        assert isinstance(sampler, Sampler)
        wait_until(lambda: len(stops) >= BLOCKS and sampler.block is None, 60, "the samples over")
    finally:
        tracker.stop(10)
    assert min(every) > 2 * LOOK, every  # long looks: the trace's end is not a look's
    last = [EVERY * k + 1 for k in range(1, BLOCKS + 1)]
    assert all(0 <= stop - end <= SLACK for stop, end in zip(stops, last, strict=True)), (stops, last)
