"""The ledger's time on literal timelines: attribution of badput, stalls, gaps, the histogram, MFU/HFU (a step is a
run of one)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from jaxmon.training.ledger import (
    DURATION_BUCKETS,
    HOST,
    RESTART,
    STALL,
    STALL_MIN_STEPS,
    STARTUP,
    Histogram,
    Interval,
    attribute,
)
from jaxmon.training.ledger import Ledger as Accounting
from tests.unit.training.conftest import python_calls

CPU0, CPU1 = ("cpu", 0), ("cpu", 1)


def test_overlapping_intervals_count_each_instant_once_for_the_one_that_started_first() -> None:
    intervals = [Interval("data", 1.0, 3.0), Interval("checkpoint", 2.0, 5.0), Interval("eval", 10.0, 11.0)]
    assert attribute(0.0, 4.0, intervals) == {"data": 2.0, "checkpoint": 1.0}
    assert attribute(4.0, 10.5, intervals) == {"checkpoint": 1.0, "eval": 0.5}
    assert attribute(5.0, 10.0, intervals) == {}  # touching is not overlapping
    # One that is still open (end +inf) is charged up to the end of the span asked about.
    assert attribute(0.0, 2.0, [Interval("checkpoint", 1.5)]) == {"checkpoint": 0.5}
    # Nested: the outer one started first and takes the whole of it.
    assert attribute(0.0, 10.0, [Interval("eval", 1.0, 9.0), Interval("data", 2.0, 3.0)]) == {"eval": 8.0}


def test_the_histogram_counts_a_value_at_a_bound_in_that_bucket_and_cumulates() -> None:
    h = Histogram()
    for value in (0.001, 0.0011, 0.5, 1000.0):
        h.observe(value)
    cumulative = dict(h.cumulative())
    assert cumulative[0.001] == 1  # le is "less than or equal"
    assert cumulative[0.0025] == 2 and cumulative[0.5] == 3 and cumulative[600.0] == 3
    assert cumulative[math.inf] == 4 == h.count
    assert h.total == pytest.approx(1000.5021)
    assert [b for b, _ in h.cumulative()] == [*DURATION_BUCKETS, math.inf]


def test_startup_is_the_time_to_the_first_completed_step_less_what_other_kinds_name() -> None:
    acct = Accounting(started=100.0)
    acct.first(130.0, [Interval("compile", 110.0, 118.0), Interval("checkpoint", 120.0, 125.0)])
    assert acct.badput == {"compile": 8.0, "checkpoint": 5.0, STARTUP: 17.0, HOST: 0.0, STALL: 0.0}
    assert acct.productive == 0.0
    assert acct.total() == 30.0


def _steady(acct: Accounting, start: float, n: int, every: float, flops: float = 0.0) -> float:
    """n steps of `every` seconds, each handed as the previous one completed (no idle time)."""
    done = start
    for _ in range(n):
        acct.run(done, [done + every], [done], [], {CPU0: flops}, {CPU0: 2 * flops})
        done += every
    return done


def test_the_idle_window_holds_the_named_badput_and_the_host_rest_and_the_busy_part_is_productive() -> None:
    acct = Accounting(started=0.0)
    acct.first(1.0, [])
    # Step 1: 1.0 -> 2.0, handed 0.5 (the host was ahead): no idle time, all productive. Step 2: 2.0 -> 4.0, handed
    # at 3.0 (1 s after step 1 completed: the devices were idle 1 s), with a data interval of 0.5 s inside that.
    acct.run(1.0, [2.0], [0.5], [], {}, {})
    acct.run(2.0, [4.0], [3.0], [Interval("data", 2.5, 3.0)], {}, {})
    assert acct.productive == pytest.approx(1.0 + 1.0)
    assert acct.badput == pytest.approx({STARTUP: 1.0, "data": 0.5, HOST: 0.5, STALL: 0.0})
    assert acct.host_wait == pytest.approx(1.0)
    assert acct.histogram.count == 2 and acct.histogram.total == pytest.approx(3.0)
    assert acct.total() == acct.last_done == 4.0


def test_badput_that_overlaps_device_work_costs_nothing() -> None:
    """A pipelined loop: the next batch loads (badput("data")) while the device computes the step handed before."""
    acct = Accounting(started=0.0)
    acct.first(1.0, [])
    # Step 2 was handed at 1.5, before step 1 completed at 2.0; its data block ran 0.6 -> 1.4 and a checkpoint of
    # the previous state 1.8 -> 2.5, both while the device computed.
    acct.run(1.0, [2.0], [0.5], [Interval("data", 0.6, 1.4)], {}, {})
    acct.run(2.0, [3.0], [1.5], [Interval("checkpoint", 1.8, 2.5)], {}, {})
    assert acct.productive == pytest.approx(2.0)
    assert acct.badput == {STARTUP: 1.0, HOST: 0.0, STALL: 0.0}
    # Handed late, the same block is charged for the part of it inside the idle window only.
    acct.run(3.0, [4.0], [3.5], [Interval("eval", 2.9, 3.2)], {}, {})
    assert acct.badput["eval"] == pytest.approx(0.2) and acct.badput[HOST] == pytest.approx(0.3)
    assert acct.productive == pytest.approx(2.5)


def test_a_host_bound_loop_with_no_blocks_is_half_host_badput() -> None:
    acct = Accounting(started=0.0)
    acct.first(0.0, [])
    done = 0.0
    for _ in range(50):  # the host sleeps 0.1 s after each completion, then the device computes 0.1 s
        acct.run(done, [done + 0.2], [done + 0.1], [], {}, {})
        done += 0.2
    assert acct.productive == pytest.approx(5.0) and acct.badput[HOST] == pytest.approx(5.0)
    assert acct.badput[STALL] == 0.0


def test_productive_and_badput_add_up_to_the_time_to_the_last_completion_to_the_microsecond() -> None:
    """Random timelines of steps, late and early hand-overs, overlapping and open intervals, restarts, jumps and
    spans of unknown completions: the total is always the last completion less the start."""
    rng = random.Random(25)
    for _ in range(40):
        acct = Accounting(started=rng.uniform(0, 1e6), window=rng.choice((4, 100)))
        now = acct.started + rng.uniform(0, 30)
        intervals: list[Interval] = []
        acct.first(now, [Interval("compile", acct.started + 0.5, now + 1.0)])
        for _ in range(rng.randrange(1, 300)):
            start = now + rng.uniform(-0.5, 0.5)
            for _ in range(rng.randrange(3)):
                lo = start + rng.uniform(-1, 1)
                intervals.append(
                    Interval(rng.choice(("data", "eval", "checkpoint")), lo, rng.choice((lo + 0.3, math.inf)))
                )
            done = now + rng.expovariate(5.0)
            kind = rng.random()
            if kind < 0.9:
                acct.run(now, [done], [now + rng.uniform(-0.5, 0.5)], intervals, {}, {})
            else:
                acct.gap(now, done, intervals, restart=kind < 0.95)
            now = done
            intervals = [i for i in intervals if i.end > now][-20:]
        assert acct.last_done == now
        assert acct.total() == pytest.approx(now - acct.started, abs=1e-6)
        assert all(v >= 0 for v in acct.badput.values()) and acct.productive >= 0


def test_a_step_far_longer_than_the_window_median_is_a_stall_for_its_excess() -> None:
    acct = Accounting(started=0.0, stall_factor=3.0)
    acct.first(0.0, [])
    done = _steady(acct, 0.0, STALL_MIN_STEPS, 0.1)
    acct.run(done, [done + 1.0], [done], [], {}, {})  # 10 x the median: 3 x is usual, 0.7 s is a stall
    assert acct.badput[STALL] == pytest.approx(0.7)
    assert acct.productive == pytest.approx(STALL_MIN_STEPS * 0.1 + 0.3)
    # Fewer steps than STALL_MIN_STEPS: nothing to judge by.
    early = Accounting(started=0.0)
    early.first(0.0, [])
    _steady(early, 0.0, STALL_MIN_STEPS - 1, 0.1)
    early.run(0.4, [1.4], [0.4], [], {}, {})
    assert early.badput[STALL] == 0.0


def test_stalls_over_a_long_run_are_the_excess_over_the_median_of_the_last_window_steps() -> None:
    """Against the definition computed from scratch at every step (statistics.median of the window's rests)."""
    rng = random.Random(20)
    acct = Accounting(started=0.0, window=16, stall_factor=2.0)
    acct.first(0.0, [])
    done, stalls = 0.0, 0.0
    rests: list[float] = []
    for n in range(400):
        if n == 200:  # a restore: the window starts again
            acct.gap(done, done + 1.0, [], restart=True)
            done, rests = done + 1.0, []
        duration = rng.choice((0.1, 0.1, 0.12, 0.09, 0.5, 1.0))
        if len(rests) >= STALL_MIN_STEPS:
            stalls += max(duration - 2.0 * statistics.median(rests[-16:]), 0.0)
        acct.run(done, [done + duration], [done], [], {}, {})
        done += duration
        rests.append(duration)
    assert stalls > 1.0
    assert acct.badput[STALL] == pytest.approx(stalls)


def test_a_restore_charges_the_gap_to_restart_and_restarts_the_window_and_a_jump_stays_productive() -> None:
    acct = Accounting(started=0.0)
    acct.first(0.0, [])
    done = _steady(acct, 0.0, 3, 0.1)
    acct.gap(done, done + 5.0, [Interval("checkpoint", done + 1.0, done + 3.0)], restart=True)
    assert acct.badput == pytest.approx({STARTUP: 0.0, HOST: 0.0, STALL: 0.0, "checkpoint": 2.0, RESTART: 3.0})
    assert len(acct.window_steps()) == 0 and acct.histogram.count == 3  # no duration for the gap
    acct.gap(10.0, 12.0, [], restart=False)
    assert acct.productive == pytest.approx(0.3 + 2.0)


def test_mfu_and_hfu_are_the_windows_flops_over_its_duration_times_the_peak() -> None:
    acct = Accounting(started=0.0, window=4)
    acct.first(0.0, [])
    _steady(acct, 0.0, 6, 0.5, flops=1e12)  # the window keeps the last 4 steps: 2 s, 4e12 model FLOPs on cpu:0
    assert len(acct.window_steps()) == 4
    mfu, hfu = acct.utilization({CPU0: 4e12, CPU1: 4e12})
    assert mfu == {CPU0: pytest.approx(4e12 / (2.0 * 4e12))}
    assert hfu == {CPU0: pytest.approx(8e12 / (2.0 * 4e12))}  # cpu:1 ran nothing the window knows of: no series
    assert Accounting(started=0.0).utilization({CPU0: 1e12}) == ({}, {})


def test_mfu_leaves_the_named_badput_out_of_its_window_but_keeps_host_time_and_stalls() -> None:
    acct = Accounting(started=0.0, window=10)
    acct.first(0.0, [])
    done = _steady(acct, 0.0, 5, 0.5, flops=1e12)
    # A 10 s checkpoint before step 6 (handed after it), then a step whose host took 0.5 s before handing it over.
    acct.run(done, [done + 10.5], [done + 10.0], [Interval("checkpoint", done, done + 10.0)], {CPU0: 1e12}, {})
    done += 10.5
    acct.run(done, [done + 1.0], [done + 0.5], [], {CPU0: 1e12}, {})
    mfu, _ = acct.utilization({CPU0: 1e12})
    assert mfu == {CPU0: pytest.approx(7e12 / ((2.5 + 0.5 + 1.0) * 1e12))}


def _recomputed(acct: Accounting, peaks: dict[tuple[str, int], float]) -> tuple[dict[tuple[str, int], float], ...]:
    """MFU and HFU from the definition, over the window's steps (what utilization() computed until issue 33)."""
    window = acct.window_steps()
    seconds = math.fsum(counted for counted, *_ in window)
    mfu: dict[tuple[str, int], float] = {}
    hfu: dict[tuple[str, int], float] = {}
    if seconds <= 0:
        return mfu, hfu
    for key, peak in peaks.items():
        if any(key in model for *_, model, _ in window):
            mfu[key] = math.fsum(model.get(key, 0.0) for *_, model, _ in window) / (seconds * peak)
        if any(key in hardware for *_, hardware in window):
            hfu[key] = math.fsum(hardware.get(key, 0.0) for *_, hardware in window) / (seconds * peak)
    return mfu, hfu


# Steps of each window's run: a huge step (1 in 5) enters and leaves the window some 200 times, a restart empties it
# about 10 times, and the FLOPs mappings (new ones every step) pass MAX_PROFILES and are pruned 3 or 4 times.
STEPS = 1000


def test_mfu_and_hfu_kept_as_steps_enter_and_leave_the_window_are_the_definition_at_every_step() -> None:
    """Random steps over devices that come and go, FLOPs and durations over many orders of magnitude (a huge one
    entering and leaving the window is where a plain running sum drifts), restarts that empty the window: after
    every step the kept sums give what the definition computed from the window gives."""
    rng = random.Random(33)
    keys = [("cpu", d) for d in range(4)]
    peaks = dict.fromkeys(keys, 1e12)
    for window in (1, 3, 50):
        acct = Accounting(started=0.0, window=window)
        acct.first(0.0, [])
        done = 0.0
        for n in range(STEPS):
            if rng.random() < 0.01:
                acct.gap(done, done + 1.0, [], restart=True)
                done += 1.0
            duration = rng.choice((1e-4, 0.1, 0.1, 1.0, 3600.0))
            named = [Interval("data", done, done + duration / 2)] if rng.random() < 0.2 else []

            def flops() -> dict[tuple[str, int], float]:
                return {k: rng.choice((0.0, 1e9, 3.3e12, 1e18)) for k in keys if rng.random() < 0.6}

            acct.run(done, [done + duration], [done + duration / 2], named, flops(), flops())
            done += duration
            mfu, hfu = acct.utilization(peaks)
            want_mfu, want_hfu = _recomputed(acct, peaks)
            assert mfu.keys() == want_mfu.keys() and hfu.keys() == want_hfu.keys(), (window, n)
            for got, want in ((mfu, want_mfu), (hfu, want_hfu)):
                for key in want:
                    # pytest.approx(want, rel=1e-12, abs=1e-300)'s test, written out: approx objects at every step
                    # were half the test's time.
                    error, bound = abs(got[key] - want[key]), max(1e-12 * abs(want[key]), 1e-300)
                    assert error <= bound, (window, n, key, got[key], want[key])


def test_reading_mfu_does_not_read_the_window_whatever_its_length() -> None:
    """The tracker reads utilization() under the lock the waiter books with: its Python work must not grow with the
    window (it rescanned every step of it for every device: 0.146 s a poll at window=100000 with 8 devices). The
    window is arrays: reading it is C loops over them, the same Python calls at 10 steps and at 1000."""
    keys = [("cpu", d) for d in range(8)]
    peaks = dict.fromkeys(keys, 1e12)
    calls = {}
    for window in (10, 1000):
        acct = Accounting(started=0.0, window=window)
        acct.first(0.0, [])
        model, hardware = dict.fromkeys(keys, 1e9), dict.fromkeys(keys, 2e9)
        for n in range(window):
            acct.run(float(n), [n + 1.0], [float(n)], [], model, hardware)
        calls[window] = python_calls(lambda: acct.utilization(peaks))  # noqa: B023
        mfu, hfu = acct.utilization(peaks)
        assert mfu == dict.fromkeys(keys, pytest.approx(1e9 / 1e12)) and hfu.keys() == mfu.keys()
    assert calls[1000] == calls[10], calls  # a Python read of each step would be 990 calls more at least


@pytest.mark.parametrize("length", [7, 40, 250], ids=["short", "long", "longer-than-the-window"])
def test_a_run_of_steps_books_what_each_step_would(length: int) -> None:
    """A run (the waiter's segments) against a run of one for each of its steps: the same totals, histogram and
    window (MFU, HFU, median) on random steps with host gaps and stalls, steps at a bucket bound and hand-offs
    before, inside and after each interval. The stall check of a run compares each step with the median at the
    run's start, one step's with the median at that step: their stalls differ, not their sum with productive
    time."""
    rng = random.Random(length)
    flops = {CPU0: 2e9, CPU1: 1e9}
    model = {CPU0: 1e9}
    one, run = (Accounting(started=0.0, window=100) for _ in range(2))
    done = 1.0
    for acct in (one, run):
        acct.first(done, ())
    for _ in range(3):  # three runs: the window fills, then turns over
        ends, handed = [], []
        t = done
        for _ in range(length):
            d = rng.choice([0.001, 0.0025, rng.uniform(0.0005, 0.004), rng.uniform(0.02, 0.05)])  # bounds, stalls
            hand = t + rng.choice([-0.001, 0.0, 0.3 * d, d, d + 0.001])
            t += d
            ends.append(t)
            handed.append(hand)
        previous = done
        for end, hand in zip(ends, handed, strict=True):
            one.run(previous, [end], [hand], (), model, flops)
            previous = end
        run.run(done, ends, handed, (), model, flops)
        done = ends[-1]
    peaks = {CPU0: 1e12, CPU1: 1e12}
    assert run.host_wait == pytest.approx(one.host_wait, rel=1e-12)
    assert run.productive + run.badput[STALL] == pytest.approx(one.productive + one.badput[STALL], rel=1e-12)
    assert run.badput[HOST] == pytest.approx(one.badput[HOST], rel=1e-12)
    assert run.histogram.counts == one.histogram.counts
    assert run.histogram.total == pytest.approx(one.histogram.total, rel=1e-12)
    assert run.last_done == one.last_done
    assert run.window_steps() == one.window_steps()
    assert run.typical_busy() == one.typical_busy()
    for mine, theirs in zip(run.utilization(peaks), one.utilization(peaks), strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-9)
    assert run.badput[STALL] > 0  # stalls were in it
