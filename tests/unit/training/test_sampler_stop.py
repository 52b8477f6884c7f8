"""A sampled trace ends with its block's last step, not at the waiter's next look: where steps are short the waiter
looks once per hundreds of them (waiter.LOOK_STEPS), and every step more in the trace is events its stop and parse pay
for (on a TPU v5e chip, 0.36 ms steps of thousands of ops made traces of tens of megabytes). Here the
sampler's own ask for that look; a real loop of 3,300 steps in tests/integration/training/test_sampler_stop.py."""

from __future__ import annotations

from jaxmon.training.handed import SamplerConfig
from jaxmon.training.sampler import Sampler
from tests.unit.training.test_sampler import FakeProfiler


def test_the_step_before_a_blocks_last_asks_for_a_look_at_the_last() -> None:
    sampler = Sampler(FakeProfiler(b""), SamplerConfig(10, 3))
    asked: list[int] = []
    handed = 0
    sampler.look = lambda: asked.append(handed)
    try:
        for handed in range(1, 16):
            sampler.handed(handed)
    finally:
        sampler.stop(5)
    assert asked == [11]  # block 10's steps are 10, 11, 12: the hand-off of 11 asks that 12 be looked at
