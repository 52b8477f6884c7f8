"""Sampled traces (jaxmon.training.sampler): which steps are traced, how a trace's split lands in the families, and
what `busy` means, with the profiler faked at its boundary (GPU and TPU XSpace bytes, tests/xspace_fakes.py).

The booked completions are placed on the fake trace's clock by hand: the sampler relates the tracker's monotonic
clock to the Unix one when it stops the trace (both injected here), so each step's window is a span of the fake
profile the test chose."""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from jaxmon.families.training import training_families
from jaxmon.training.blocks import block_start, period_began, traced_steps
from jaxmon.training.handed import SamplerConfig
from jaxmon.training.sampler import Busy, Sampler
from jaxmon.training_readings import ProfileReading, TrainingReading
from tests.helpers import wait_until
from tests.unit.xla.test_split_fakes import GPU0, GPU1, TPU0, TPU1
from tests.xspace_fakes import START_UNIX_NS, gpu_space, tpu_space

US = 1e-6
NOW = 5000.0  # the tracker's clock when the trace stops: the block's last completion
BEFORE = NOW - 1.0  # the tracker's clock while a trace starts: before the fake profiles' steps


class FakeProfiler:
    """Hands back `data` as the trace; `user` makes every start Busy, `preempt` makes the stop Busy."""

    def __init__(self, data: bytes, platform: str = "gpu") -> None:
        self.data = data
        self.platform = platform
        self.user = False
        self.preempt = False
        self.starts = 0
        self.stops = 0
        self.python: list[bool] = []

    def start(self, python: bool) -> None:
        if self.user:
            raise Busy("the user is profiling")
        self.starts += 1
        self.python.append(python)

    def stop(self) -> bytes:
        self.stops += 1
        if self.preempt:
            raise Busy("the user started a trace")
        return self.data

    def export(self, directory: Path) -> None:
        self.stops += 1
        run = directory / "plugins" / "profile" / "2026_01_01_00_00_00"
        run.mkdir(parents=True)
        (run / "fakehost.xplane.pb").write_bytes(self.data)

    def devices(self) -> Mapping[tuple[str, int], tuple[str, int]]:
        # local ordinals 0, 1 are the job's devices 4, 5 (a second process's)
        return {(self.platform, 0): (self.platform, 4), (self.platform, 1): (self.platform, 5)}


@pytest.fixture
def make() -> Iterator[object]:
    made: list[Sampler] = []

    def factory(
        profiler: FakeProfiler, every: int = 10, steps: int = 2, end_us: float = 100.0, in_process: int = 1 << 20
    ) -> Sampler:
        # While a trace starts, the monotonic clock reads BEFORE; at the stop, NOW and the Unix clock the fake
        # profile's `end_us`.
        sampler = Sampler(
            profiler,
            SamplerConfig(every, steps),
            clock=lambda: NOW if profiler.stops >= profiler.starts else BEFORE,
            wall_ns=lambda: START_UNIX_NS + round(end_us * 1000),
            in_process=in_process,
        )
        made.append(sampler)
        return sampler

    yield factory
    for s in made:
        s.stop(5)


def at(us: float, end_us: float = 100.0) -> float:
    """The tracker's clock at `us` of the fake profile (NOW is `end_us`)."""
    return NOW - (end_us - us) * US


def complete(sampler: Sampler, done: list[tuple[int, float]]) -> None:
    """The waiter booked these (number, completion) steps."""
    sampler.completed([n for n, _ in done], [when for _, when in done])


def got(sampler: Sampler) -> ProfileReading:
    reading = sampler.reading()
    assert reading is not None
    return reading


def run_block(sampler: Sampler, profiler: FakeProfiler, completions: list[tuple[int, float]]) -> ProfileReading:
    sampler.handed(8)  # block 10 starts: the trace starts two steps ahead
    wait_until(lambda: profiler.starts == 1 or profiler.user, what="the trace started")
    complete(sampler, completions)
    wait_until(lambda: sum(got(sampler).results.values()) == 1, what="the sample booked")
    return got(sampler)


def test_blocks_start_at_multiples_of_every_in_every_process() -> None:
    every = 10
    starts = {n: block_start(n, every) for n in range(0, 45)}
    assert {n: b for n, b in starts.items() if b is not None} == {8: 10, 18: 20, 28: 30, 38: 40}
    assert list(traced_steps(20, 2)) == [20, 21]
    # Two processes of a job, one of which joins late (its first number 13): the same blocks from there on.
    late = {n: block_start(n, every) for n in range(13, 45)}
    assert {n: b for n, b in late.items() if b is not None} == {18: 20, 28: 30, 38: 40}
    assert all(block_start(n, 0) is None for n in range(100))  # every = 0: off
    assert block_start(-2, every) is None  # step 0 (the compilation's) is never a block


def test_at_most_one_block_per_period_is_traced_and_processes_agree() -> None:
    """Blocks every 1 s of steps, min_seconds 60: the first block, then the first one after each minute begins; a
    second process whose clock is 20 ms off (and which started later) picks the same blocks but the one within
    20 ms of the minute's start."""

    def traced(offset_ns: int, first: int) -> list[int]:
        period, out = None, []
        for block in range(first, 300):  # block k starts at k seconds of Unix time
            began, period = period_began(period, START_UNIX_NS + block * 10**9 + offset_ns, 60.0)
            if began:
                out.append(block)
        return out

    base = START_UNIX_NS // 10**9 % 60  # the second of the minute block 0 starts at
    minutes = [b for b in range(1, 300) if (base + b) % 60 == 0]
    assert traced(0, 0) == [0, *minutes]
    late = traced(20_000_000, 7)
    assert late[0] == 7 and late[1:] == minutes  # 20 ms late: the same blocks from the first minute on
    assert period_began(None, 0, 60.0) == (True, 0) and period_began(0, 59 * 10**9, 60.0) == (False, 0)
    assert period_began(0, 60 * 10**9, 60.0) == (True, 1)


def test_only_the_block_is_traced(make) -> None:  # type: ignore[no-untyped-def]
    profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
    sampler = make(profiler)
    for n in range(0, 8):
        sampler.handed(n)
        complete(sampler, [(n, at(0) - (8 - n))])
    assert profiler.starts == 0 and got(sampler).results == {"taken": 0, "busy": 0, "failed": 0, "skipped": 0}


def test_gpu_split_lands_on_the_job_devices(make) -> None:  # type: ignore[no-untyped-def]
    """Steps 10 and 11: windows [0, 50) and [50, 100) us of the fake GPU profile; the split is the hand-laid one
    (tests/unit/xla/test_split_fakes.py), on the job's device ids."""
    profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
    sampler = make(profiler)
    reading = run_block(sampler, profiler, [(9, at(0)), (10, at(50)), (11, at(100))])
    assert reading.results == {"taken": 1, "busy": 0, "failed": 0, "skipped": 0}
    assert profiler.python == [False]  # a sample traces no Python calls
    by_id = {d.id: d for d in reading.devices}
    assert sorted(by_id) == [4, 5]
    g0, g1 = by_id[4], by_id[5]
    assert g0.profiled_seconds_total == pytest.approx(100 * US)
    expected = {"compute": 50 * US, "collective": 20 * US, "copy": 15 * US, "idle": 15 * US}
    assert g0.parts == pytest.approx(expected)
    assert g0.collectives == pytest.approx({"all-reduce": 30 * US, "all-gather": 10 * US})
    assert g1.parts == pytest.approx({"compute": 65 * US, "collective": 15 * US, "copy": 0, "idle": 20 * US})
    assert g1.collectives == pytest.approx({"all-reduce": 40 * US, "send-recv": 10 * US})
    # the copy part by direction, with the memcpy events' bytes (each started inside a window)
    assert {d: c[1] for d, c in g0.copies.items()} == {"device_to_host": 1048576, "host_to_device": 4096}
    assert {d: c[0] for d, c in g0.copies.items()} == pytest.approx(
        {"device_to_host": 10 * US, "host_to_device": 5 * US}
    )
    assert g1.copies == {}

    samples = family_samples(TrainingReading(profile=reading))
    device = {"workload": "w", "device": "4", "platform": "gpu"}
    assert samples[("jaxmon_training_profiles_total", key({"workload": "w"}, result="taken"))] == 1
    parts = {p: samples[("jaxmon_training_profile_seconds_total", key(device, part=p))] for p in expected}
    assert parts == pytest.approx(expected)
    assert sum(parts.values()) == pytest.approx(samples[("jaxmon_training_profiled_seconds_total", key(device))])
    assert samples[
        ("jaxmon_training_profile_collective_seconds_total", key(device, op="all-gather", axes="", link="unknown"))
    ] == (pytest.approx(10 * US))
    copy = {
        d: (
            samples[("jaxmon_training_profile_copy_seconds_total", key(device, direction=d))],
            samples[("jaxmon_training_profile_copy_bytes_total", key(device, direction=d))],
        )
        for d in ("device_to_host", "host_to_device")
    }
    assert {d: c[1] for d, c in copy.items()} == {"device_to_host": 1048576, "host_to_device": 4096}
    assert {d: c[0] for d, c in copy.items()} == pytest.approx({"device_to_host": 10 * US, "host_to_device": 5 * US})


def test_tpu_split_and_a_second_sample_adds_up(make) -> None:  # type: ignore[no-untyped-def]
    """One window over the whole TPU profile, twice: the counters hold the sum of both samples."""
    profiler = FakeProfiler(tpu_space({0: TPU0, 1: TPU1}), platform="tpu")
    sampler = make(profiler, steps=1)
    run_block(sampler, profiler, [(9, at(0)), (10, at(100))])
    sampler.handed(18)
    wait_until(lambda: profiler.starts == 2, what="the second trace started")
    complete(sampler, [(19, at(0)), (20, at(100))])
    wait_until(lambda: got(sampler).results["taken"] == 2, what="two samples")
    by_id = {d.id: d for d in got(sampler).devices}
    assert by_id[4].parts == pytest.approx(
        {"compute": 90 * US, "collective": 60 * US, "copy": 10 * US, "idle": 40 * US}
    )
    assert by_id[4].collectives == pytest.approx({"all-reduce": 30 * US, "all-gather": 30 * US})
    assert by_id[5].parts["collective"] == pytest.approx(24 * US)
    assert by_id[5].profiled_seconds_total == pytest.approx(200 * US)


def test_a_step_that_began_before_the_trace_is_left_out(make) -> None:  # type: ignore[no-untyped-def]
    """The job ran ahead: step 9 completed before the trace's start (its clock's 0), so step 10's window is not
    whole inside it and only step 11's counts."""
    profiler = FakeProfiler(gpu_space({0: GPU0}))
    sampler = make(profiler)
    reading = run_block(sampler, profiler, [(9, at(-20)), (10, at(40)), (11, at(100))])
    assert reading.results["taken"] == 1
    (g0,) = reading.devices
    assert g0.profiled_seconds_total == pytest.approx(60 * US)  # [40, 100) us only
    # [40,60) compute; [60,70) copy; [70,80) the all-gather alone; [80,85) idle; [85,90) copy; [90,100) idle
    assert g0.parts == pytest.approx({"compute": 20 * US, "collective": 10 * US, "copy": 15 * US, "idle": 15 * US})


class SlowStart(FakeProfiler):
    """A profiler whose start takes `seconds` of the tracker's clock (`clock`: a one-item list, the time now): a
    TPU's session can take hundreds of milliseconds to run, while the job steps on."""

    def __init__(self, data: bytes, clock: list[float], seconds: float) -> None:
        super().__init__(data)
        self.clock, self.seconds = clock, seconds

    def start(self, python: bool) -> None:
        super().start(python)
        self.clock[0] += self.seconds

    def stop(self) -> bytes:
        self.clock[0] = NOW
        return super().stop()


def test_a_slow_start_leaves_out_the_steps_before_it_and_asks_earlier_next_time() -> None:
    """Steps of 20 us; the trace is asked for at -45 us and runs from 5 us. Step 10's window [0, 40) is inside the
    profile's own extent, but began before the trace ran (its device tracer may not have yet: the device would read
    idle), so only step 11's [40, 100) counts; and the next block's trace is asked for 2 + floor(50 / 20) = 4 steps
    ahead (block 20 at step 16, not 18: steps 17 to 19 take 60 us, more than the start), at most every - steps; a
    start shorter than a step leaves it at 2."""
    clock = [at(-45)]
    profiler = SlowStart(gpu_space({0: GPU0}), clock, 50 * US)
    sampler = Sampler(profiler, SamplerConfig(10, 2), clock=lambda: clock[0], wall_ns=lambda: START_UNIX_NS + 100_000)
    try:
        complete(sampler, [(7, at(-80)), (8, at(-60))])
        sampler.handed(8)
        wait_until(lambda: profiler.starts == 1, what="the trace started")
        complete(sampler, [(9, at(0)), (10, at(40)), (11, at(100))])
        wait_until(lambda: got(sampler).results["taken"] == 1, what="the sample booked")
        (g0,) = got(sampler).devices
        assert g0.profiled_seconds_total == pytest.approx(60 * US)
        assert g0.parts == pytest.approx({"compute": 20 * US, "collective": 10 * US, "copy": 15 * US, "idle": 15 * US})
        assert sampler.lead == 4 and sampler.blocks.lead == 4
        clock[0] = at(-45)
        sampler.handed(15)
        assert profiler.starts == 1  # not at step 15
        sampler.handed(16)
        wait_until(lambda: profiler.starts == 2, what="block 20's trace started at step 16")
        assert sampler.block == 20
        complete(sampler, [(19, at(10)), (20, at(40)), (21, at(100))])
        wait_until(lambda: got(sampler).results["taken"] == 2, what="the second sample booked")
        assert sampler.lead == 2  # 2 + floor(50 / 60): its steps took 60 us, longer than the start
        # A start of 1 s: the lead is every - steps = 8 at most, and every window began before the trace ran.
        profiler.seconds, clock[0] = 1.0, at(-45)
        sampler.handed(28)
        wait_until(lambda: profiler.starts == 3, what="block 30's trace started")
        complete(sampler, [(29, at(0)), (30, at(40)), (31, at(100))])
        wait_until(lambda: sum(got(sampler).results.values()) == 3, what="the third sample booked")
        assert sampler.lead == 8
        assert got(sampler).results == {"taken": 2, "busy": 0, "failed": 1, "skipped": 0}
    finally:
        sampler.stop(5)


class HeldStop(FakeProfiler):
    """A profiler whose stop waits for `release` (a TPU's session takes 0.6 s to stop: the job steps on meanwhile);
    its trace runs from the tracker's clock at(-45) (`clock`, a one-item list) and stops at NOW."""

    def __init__(self, data: bytes, clock: list[float]) -> None:
        super().__init__(data)
        self.clock = clock
        self.release = threading.Event()
        self.stopping = threading.Event()

    def start(self, python: bool) -> None:
        super().start(python)
        self.clock[0] = at(-45)

    def stop(self) -> bytes:
        self.stopping.set()
        self.release.wait(10)
        self.clock[0] = NOW
        return super().stop()


def test_a_block_asked_for_while_the_last_sample_stops_waits_for_it_and_is_busy_once_its_steps_ran() -> None:
    """Block 20 is asked for a second before its trace can start (block 10's stops meanwhile): that wait is no start
    of the profiler's, and the lead stays 2 (asking earlier would not end the stop sooner; 2 + floor(1 s / 50 us),
    capped at 8, if it counted). Block 30, asked for while block 20's trace stops, whose steps ran before the stop
    ended: counted busy (jaxmon's own trace held the profiler), not lost."""
    clock = [at(-45)]
    profiler = HeldStop(gpu_space({0: GPU0}), clock)
    sampler = Sampler(profiler, SamplerConfig(10, 2), clock=lambda: clock[0], wall_ns=lambda: START_UNIX_NS + 100_000)

    def block(n0: int, next_steps_ran: bool) -> None:
        profiler.stopping.clear()
        wait_until(lambda: profiler.starts == n0 // 10, what=f"block {n0}'s trace started")
        complete(sampler, [(n0 - 1, at(0)), (n0, at(50)), (n0 + 1, at(100))])
        wait_until(profiler.stopping.is_set, what=f"block {n0}'s trace stopping")
        clock[0] = at(-45) - 1.0
        sampler.handed(n0 + 8)  # the next block asked for: it waits for the stop
        if next_steps_ran:
            complete(sampler, [(n0 + 9, at(0)), (n0 + 10, at(50)), (n0 + 11, at(100))])
        profiler.release.set()
        wait_until(lambda: sum(got(sampler).results.values()) >= n0 // 10, what=f"block {n0}'s sample booked")
        profiler.release.clear()

    try:
        sampler.handed(8)
        block(10, False)
        block(20, True)
        wait_until(lambda: sum(got(sampler).results.values()) == 3, what="block 30 counted")
        assert sampler.lead == 2
        assert got(sampler).results == {"taken": 2, "busy": 1, "failed": 0, "skipped": 0}
        assert profiler.starts == 2
    finally:
        profiler.release.set()
        sampler.stop(5)


@pytest.mark.parametrize("handed", [19, 21, 18, None])
def test_a_block_the_job_reached_while_the_last_sample_stopped_is_busy_not_traced(handed: int | None) -> None:
    """Block 20, asked for at step 18 while block 10's trace stops, whose lead steps the job handed meanwhile (none
    of them computed yet): a trace started then would run after step 19's window began (on a TPU v5e chip, 16 ms
    steps asked for every 40 failed so, 4 of 12). Counted busy and never started; a block the job did not reach
    (18 handed: its lead of 2 left, or no host number) is traced."""
    clock = [at(-45)]
    profiler = HeldStop(gpu_space({0: GPU0}), clock)
    sampler = Sampler(profiler, SamplerConfig(10, 2), clock=lambda: clock[0], wall_ns=lambda: START_UNIX_NS + 100_000)
    dispatched = [8]
    sampler.dispatched = lambda: dispatched[0]
    traced = handed in (18, None)
    try:
        sampler.handed(8)
        wait_until(lambda: profiler.starts == 1, what="block 10's trace started")
        complete(sampler, [(9, at(0)), (10, at(50)), (11, at(100))])
        wait_until(profiler.stopping.is_set, what="block 10's trace stopping")
        sampler.handed(18)
        dispatched[0] = handed  # type: ignore[assignment]
        profiler.release.set()
        if traced:
            wait_until(lambda: profiler.starts == 2, what="block 20's trace started")
            complete(sampler, [(19, at(0)), (20, at(50)), (21, at(100))])
        wait_until(lambda: sum(got(sampler).results.values()) == 2, what="block 20 counted")
        want = {"taken": 2, "busy": 0} if traced else {"taken": 1, "busy": 1}
        assert got(sampler).results == {**want, "failed": 0, "skipped": 0}
        assert profiler.starts == (2 if traced else 1)
    finally:
        profiler.release.set()
        sampler.stop(5)


def test_no_whole_step_is_a_failed_sample(make) -> None:  # type: ignore[no-untyped-def]
    profiler = FakeProfiler(gpu_space({0: GPU0}))
    sampler = make(profiler)
    reading = run_block(sampler, profiler, [(9, at(-50)), (10, at(-10)), (11, at(-5))])
    assert reading.results == {"taken": 0, "busy": 0, "failed": 1, "skipped": 0} and reading.devices == ()


def test_a_block_that_holds_badput_is_dropped_at_once_and_tried_again_on_clean_steps(make) -> None:  # type: ignore[no-untyped-def]
    """Block 10's trace runs (it started at step 8) when an eval opens after step 9 was handed: the trace ends at
    once, unread, counted `skipped`; at the eval's close the retry is block 12 (its trace starts at step 10, the
    first handed after it), whose split is the hand-laid one."""
    profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
    sampler = make(profiler)
    sampler.handed(8)
    wait_until(lambda: profiler.starts == 1, what="the trace started")
    sampler.badput("eval", "eval-1", 9, False)
    wait_until(lambda: got(sampler).results["skipped"] == 1, what="the sample dropped")
    assert profiler.stops == 1 and got(sampler).devices == () and got(sampler).results["taken"] == 0
    sampler.handed(9)  # not a block: 11 is not a multiple of 10, and no retry is planned while the eval runs
    assert profiler.starts == 1
    sampler.closed("eval-1", 9)
    sampler.handed(10)
    wait_until(lambda: profiler.starts == 2, what="the retry's trace started")
    complete(sampler, [(11, at(0)), (12, at(50)), (13, at(100))])
    wait_until(lambda: got(sampler).results["taken"] == 1, what="the retry booked")
    assert got(sampler).results == {"taken": 1, "busy": 0, "failed": 0, "skipped": 1}
    g0 = {d.id: d for d in got(sampler).devices}[4]
    assert g0.parts == pytest.approx({"compute": 50 * US, "collective": 20 * US, "copy": 15 * US, "idle": 15 * US})


def test_busy_when_the_user_profiles_and_when_the_users_trace_ends_jaxmons(make) -> None:  # type: ignore[no-untyped-def]
    profiler = FakeProfiler(gpu_space({0: GPU0}))
    profiler.user = True
    sampler = make(profiler)
    reading = run_block(sampler, profiler, [(9, at(0)), (10, at(50)), (11, at(100))])
    assert reading.results == {"taken": 0, "busy": 1, "failed": 0, "skipped": 0}
    assert profiler.starts == 0 and profiler.stops == 0  # nothing started, nothing stopped: nothing disturbed
    profiler.user, profiler.preempt = False, True
    sampler.handed(18)
    wait_until(lambda: profiler.starts == 1, what="the second trace started")
    complete(sampler, [(19, at(0)), (20, at(50)), (21, at(100))])
    wait_until(lambda: got(sampler).results["busy"] == 2, what="the preempted sample counted busy")
    assert got(sampler).devices == ()


def test_a_trace_on_demand_holds_whole_steps(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profiler = FakeProfiler(gpu_space({0: GPU0}))
    sampler = make(profiler, every=0)
    for n in range(-2, 30):
        sampler.handed(n)  # sampling off: no step asks for a trace (0 and -2 included)
        assert sampler.block is None
    out: list[bytes] = []
    thread = threading.Thread(target=lambda: out.append(sampler.demand(tmp_path, steps=2)))
    thread.start()
    wait_until(lambda: profiler.starts == 1, what="the trace on demand started")
    for n in range(3):  # the first completion opens the first whole step
        assert profiler.stops == 0
        complete(sampler, [(n, at(n * 10))])
    thread.join(10)
    assert profiler.python == [True] and profiler.stops == 1
    assert sampler.reading() is None  # every = 0: traces on demand only, no sampled series
    with tarfile.open(fileobj=io.BytesIO(out[0]), mode="r:gz") as tar:
        (member,) = tar.getmembers()
        assert member.name == "plugins/profile/2026_01_01_00_00_00/fakehost.xplane.pb"
        extracted = tar.extractfile(member)
        assert extracted is not None and extracted.read() == profiler.data


def key(labels: Mapping[str, str], **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**labels, **more}.items()))


def family_samples(reading: TrainingReading) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families: list[Metric] = list(training_families([({"workload": "w"}, reading)]))
    return {(s.name, key(s.labels)): s.value for f in families for s in f.samples}


def test_the_options_reach_the_tracker_and_refuse_a_block_with_no_room() -> None:
    from pydantic import ValidationError

    from jaxmon.collectors.training import PROFILE_EVERY, PROFILE_MIN_SECONDS, TrainingOptions

    assert TrainingOptions().tracker_config().profile == SamplerConfig(PROFILE_EVERY, 2, PROFILE_MIN_SECONDS)
    assert TrainingOptions(profile={"every": 0}).tracker_config().profile == SamplerConfig(0, 2, 60.0)  # type: ignore[arg-type]
    off = TrainingOptions(profile={"every": 50, "steps": 4})  # type: ignore[arg-type]
    assert off.tracker_config().profile == SamplerConfig(50, 4, 60.0)
    assert TrainingOptions(profile={"min_seconds": 0}).tracker_config().profile.min_seconds == 0  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"profile.every \(3\) must be 0 \(off\) or at least"):
        TrainingOptions(profile={"every": 3, "steps": 2})  # type: ignore[arg-type]
