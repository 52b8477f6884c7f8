"""A large sampled trace is read in a child process (jaxmon.training.trace_split), so that its parse does not hold
the training process's GIL: the child is a real `python -m jaxmon.training.trace_split`, and what it reads is what
the sampler's own thread reads (the profiler is faked at its boundary, with GPU XSpace bytes: tests/xspace_fakes.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jaxmon.training.handed import SamplerConfig
from jaxmon.training.sampler import Sampler
from jaxmon.training.trace_links import Catalog
from jaxmon.training.trace_split import split, split_trace
from tests.helpers import wait_until
from tests.unit.training.test_sampler import NOW, US, FakeProfiler, at, got, run_block
from tests.unit.xla.test_split_fakes import GPU0, GPU1
from tests.xspace_fakes import START_UNIX_NS, gpu_space

END_US = 100.0


@pytest.fixture
def samplers() -> Iterator[list[Sampler]]:
    made: list[Sampler] = []
    yield made
    for s in made:
        s.stop(5)


def sampler(made: list[Sampler], profiler: FakeProfiler, in_process: int) -> Sampler:
    s = Sampler(
        profiler,
        SamplerConfig(10, 2),
        clock=lambda: NOW,
        wall_ns=lambda: START_UNIX_NS + round(END_US * 1000),
        in_process=in_process,
    )
    made.append(s)
    return s


def test_the_child_reads_the_split_the_sampler_reads_itself(samplers: list[Sampler]) -> None:
    completions = [(9, at(0)), (10, at(50)), (11, at(100))]
    readings = []
    for limit in (1 << 20, 0):  # 0: every trace is larger than the limit
        profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
        readings.append(run_block(sampler(samplers, profiler, limit), profiler, completions))
    here, child = readings
    assert child.results == here.results == {"taken": 1, "busy": 0, "failed": 0, "skipped": 0}
    assert len(child.devices) == 2 and child.devices == here.devices
    assert child.devices[0].profiled_seconds_total == pytest.approx(100 * US)


def test_a_trace_the_child_cannot_read_is_a_failed_sample_and_the_next_is_taken(samplers: list[Sampler]) -> None:
    profiler = FakeProfiler(b"\x0a\xff\xff")  # a plane whose length runs past the end of the bytes
    s = sampler(samplers, profiler, 0)
    assert run_block(s, profiler, [(9, at(0)), (10, at(50)), (11, at(100))]).results["failed"] == 1
    profiler.data = gpu_space({0: GPU0})
    s.handed(18)
    wait_until(lambda: profiler.starts == 2, what="the second trace started")
    s.completed([19, 20, 21], [at(0), at(50), at(100)])
    wait_until(lambda: got(s).results["taken"] == 1, what="the next sample taken")


def test_the_child_says_why_it_failed() -> None:
    with pytest.raises(RuntimeError, match="reader process failed"):
        split(b"\x0a\xff\xff", Catalog(), [(START_UNIX_NS, START_UNIX_NS + 1000)], limit=0)
    data = gpu_space({0: GPU0})
    windows = [(START_UNIX_NS, START_UNIX_NS + 50_000)]
    assert split(data, Catalog(), windows, limit=0) == split_trace(data, Catalog(), windows)
