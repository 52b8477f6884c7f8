"""How the waiter dates the steps it takes in one batch (jaxmon/training/dating.py): on literals, and on real JAX
steps against the loop's own completion times, steady and uneven (every 10th step 5x longer)."""

from __future__ import annotations

import bisect
import itertools
import random
import time

import jax
import jax.numpy as jnp
import pytest

import jaxmon
from jaxmon.training.dating import apportion
from jaxmon.training.ledger import DURATION_BUCKETS
from jaxmon.training.tracker import Tracker
from jaxmon.training.waiter import LOOK
from tests.unit.training.conftest import MakeTracker, booked


def test_one_step_completes_when_the_wait_returned() -> None:
    assert apportion(1.0, 2.0, [1.5], []) == [2.0]


def test_a_loop_waiting_for_each_step_dates_each_at_the_next_call() -> None:
    # Steps handed at 0, 1, 4, 5; each completed just before the next call: 0.9, 3.9, 4.9; the newest at 6.
    assert apportion(0.0, 6.0, [0.0, 1.0, 4.0, 5.0], []) == [1.0, 4.0, 5.0, 6.0]


def test_a_loop_two_ahead_dates_each_step_three_calls_later() -> None:
    # Calls at 0..5 (1 s apart), 6 and 7 while the newest (handed at 5) ran: step k is dated at call k + 3.
    out = apportion(2.5, 8.5, [3.0, 4.0, 5.0], [6.0, 7.0])
    assert out == [6.0, 7.0, 8.5]


def test_calls_made_before_the_segment_started_are_no_paced_host_s() -> None:
    # Keras's epoch, in CI: four steps handed at 13-36 ms, ten more at 40-45 (the host ran ahead, then waited at the
    # epoch's end), the segment from the step before's completion at 64 to the newest's seen at 290. As a paced host's
    # calls (lead 10) the steps would complete at the calls 44, 44 and 45, all before 64: three steps of no time. The
    # queue dates them, fitted to the completion seen.
    handed, later = [13.0, 19.0, 25.0, 36.0], [40.0, 41.0, 42.0, 43.0, 43.5, 44.0, 44.2, 44.5, 44.7, 45.0]
    out = apportion(64.0, 290.0, handed, later)
    assert out == pytest.approx([120.5, 177.0, 233.5, 290.0])
    # The same host with calls inside the segment (its device paced it): dated by them.
    assert apportion(64.0, 290.0, handed, [70.0, 120.0, 180.0, 240.0]) == [120.0, 180.0, 240.0, 290.0]


def test_a_device_that_kept_up_completes_each_step_before_the_next_call() -> None:
    # The newest was done before the look (not ran), the device kept up; a typical step (1.2) a little over the host's
    # rhythm (1.0) must not carry on from step to step: it would pile the last steps at the look, steps of no time.
    handed = [float(k) for k in range(10)]
    out = apportion(0.0, 10.0, handed, [], ran=False, paced=False, busy=1.2)
    assert out == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    # Where the host's rhythm is slower than a step, each completes a step's time after its call.
    assert apportion(0.0, 20.0, [0.0, 2.0, 4.0], [], ran=False, paced=False, busy=0.5) == [0.5, 2.5, 4.5]


def test_a_burst_done_before_the_look_is_fitted_into_its_interval() -> None:
    # Four steps handed in a burst, done unseen by 2.0: a typical step of 1.0 would put the last at 4.0, after it was
    # seen done, so the typical time is taken down until they fit (not the last ones piled at 2.0).
    assert apportion(0.0, 2.0, [0.0, 0.1, 0.2, 0.3], [], ran=False, busy=1.0) == [0.5, 1.0, 1.5, 2.0]


def test_a_burst_the_host_waited_for_before_a_mark_shares_the_time_up_to_the_mark() -> None:
    # Four steps handed in a burst (0.0-0.3), done unseen (the look came at 20), the mark handed at 8 (Keras's epoch
    # end, once the device was done): they ran back to back from 0 to 8, whatever a typical step (1.0) says.
    assert apportion(0.0, 20.0, [0.0, 0.1, 0.2, 0.3], [], ran=False, busy=1.0, marked=8.0) == [2.0, 4.0, 6.0, 8.0]
    # No mark: a typical step after the one before (the look's time bounds them only).
    assert apportion(0.0, 20.0, [0.0, 0.1, 0.2, 0.3], [], ran=False, busy=1.0) == [1.0, 2.0, 3.0, 4.0]


def test_a_waiting_host_s_steps_before_a_pause_are_not_piled_into_it() -> None:
    # Four steps handed 1.0 apart by a host that waited for each (lead 0 at recent looks), then a pause: the segment
    # ends by the next hand-off at 20, and a typical step of a slower time (1.5) would queue them up into the pause
    # (1.5, 3.0, 4.5, 6.0). Each was done by the host's next call; the last a typical step after the one before.
    assert apportion(0.0, 20.0, [0.0, 1.0, 2.0, 3.0], [], ran=False, busy=1.5, lead=0) == [1.0, 2.0, 3.0, 4.5]
    # A host two ahead: steps 0 and 1 bounded by the calls three later (none in the segment for the others).
    assert apportion(0.0, 20.0, [0.0, 0.1, 0.2, 0.3], [], ran=False, busy=1.5, lead=2) == [0.3, 1.8, 3.3, 4.8]
    # No lead known (the host's calls bound nothing): the queue's.
    assert apportion(0.0, 20.0, [0.0, 1.0, 2.0, 3.0], [], ran=False, busy=1.5) == [1.5, 3.0, 4.5, 6.0]


def test_a_loop_far_ahead_of_its_device_shares_the_interval_evenly() -> None:
    # Calls long before the interval began: no rhythm of the device's in them.
    assert apportion(10.0, 14.0, [1.0, 1.1, 1.2, 1.3], []) == [11.0, 12.0, 13.0, 14.0]


def test_a_batch_after_a_pause_shares_the_interval_from_its_first_hand_off() -> None:
    # The last completion at 0; the loop paused 60 ms, then handed 300 steps 0.5 ms apart; the newest was seen done
    # 6 ms after its hand-off (a loaded machine's late wake): no rhythm of the device's, shared evenly, but not from
    # 0: nothing ran before the first step was handed, and the pause is the first step's time, not smeared over 300.
    handed = [0.06 + 0.0005 * k for k in range(300)]
    end = handed[-1] + 0.006
    out = apportion(0.0, end, handed, [])
    assert out[0] > handed[0] and out[-1] == end and out == sorted(out)
    assert out[1] - out[0] == pytest.approx((end - handed[0]) / 300)


def test_completions_stay_in_order_and_inside_the_interval() -> None:
    out = apportion(5.0, 9.0, [5.0, 4.9, 12.0, 6.0], [])
    assert out == sorted(out) and out[0] >= 5.0 and out[-1] == 9.0


@pytest.mark.parametrize("n", [31, 32, 200])
def test_a_long_paced_batch_is_dated_as_a_short_one_is(n: int) -> None:
    """From VECTOR_STEPS steps on the paced dating is NumPy's: the same dates as the step-by-step rule (each step
    at the host's call `lead + 1` steps later, kept in order and inside the interval), on jittered calls that go
    back and forth, some before the interval and some after its end."""
    rng = random.Random(n)
    for lead in (0, 2):
        for ran in (True, False):
            start, end = 10.0, 10.0 + n * 0.001
            calls = sorted(start + rng.uniform(-0.0005, n * 0.001 + 0.0005) for _ in range(n + lead))
            calls[n // 2] += 0.003  # out of order
            handed, later = calls[:n], calls[n:]
            times = [*handed, *later]
            expected, previous = [], start
            for bound in times[lead + 1 : lead + n]:
                previous = min(max(bound, previous), end)
                expected.append(previous)
            last = min(end, previous + (previous - start) / (n - 1)) if not ran else end
            assert apportion(start, end, handed, later, ran) == [*expected, last]


def steps() -> tuple[jax.stages.Wrapped, jax.stages.Wrapped]:
    """A step of about 6 ms and one 5x longer (the same work repeated 5x), both compiled: a GIL switch (5 ms) of the
    waiter's is less than a step's time, on a loaded machine too."""
    size = 256
    x = jnp.ones((size, size))

    def make(repeat: int) -> jax.stages.Wrapped:
        f = jax.jit(lambda x: jax.lax.fori_loop(0, repeat, lambda _, c: jnp.tanh(c @ c) / size, x))
        f(x).block_until_ready()
        return f

    one = make(1)
    start = time.perf_counter()
    for _ in range(5):
        one(x).block_until_ready()
    repeat = max(1, round(0.006 / ((time.perf_counter() - start) / 5)))
    return make(repeat), make(5 * repeat)


def bucket_counts(durations: list[float]) -> list[int]:
    counts = [0] * (len(DURATION_BUCKETS) + 1)
    for d in durations:
        counts[bisect.bisect_left(DURATION_BUCKETS, d)] += 1
    return counts


@pytest.mark.parametrize("uneven", [False, True], ids=["steady", "uneven"])
def test_batched_durations_are_the_loops_own(make_tracker: MakeTracker, uneven: bool) -> None:
    """The loop waits for each step and notes its completion (the truth); the waiter takes the steps in batches of
    about LOOK's worth and dates them. The durations' sum is the loop's, each is within a few ms of the loop's own,
    and the histogram sees every long step above the short ones' bucket."""
    short, long = steps()
    x = jnp.ones((256, 256))
    tracker = make_tracker()
    done = []
    count = 60
    for n in range(count):
        x = (long if uneven and n % 10 == 5 else short)(x)
        jaxmon.step(n, x)
        x.block_until_ready()
        done.append(time.monotonic())
    reading = booked(tracker, count)
    # Taken in batches: at most one look per LOOK of the loop's time, and the last ones after it ended.
    assert looks(tracker) <= (done[-1] - done[0]) / LOOK + 3, (looks(tracker), done[-1] - done[0])
    truth = [b - a for a, b in itertools.pairwise(done)]
    assert reading.duration_count == count - 1 and reading.steps_total == count  # +Inf: every step but the first
    # The sum is the loop's: the last step, done before the waiter's last look, is dated at most LOOK late.
    assert reading.duration_sum == pytest.approx(done[-1] - done[0], abs=LOOK + 0.01)
    mine = [b for _, b in reading.duration_buckets]
    theirs = list(itertools.accumulate(bucket_counts(truth)))
    # The typical step lands in the loop's bucket, or the next one either way (a step near a bound moves).
    assert abs(bisect.bisect_left(mine, count // 2) - bisect.bisect_left(theirs, count // 2)) <= 1, (mine, theirs)
    if uneven:
        # The long steps are seen long: above a bound below most long ones. The count comes from the truth, not from
        # the design: on a loaded machine a long step can come out shorter than 5x, and a short one longer.
        longs = [truth[n - 1] for n in range(count) if n % 10 == 5]  # duration n: done[n] - done[n - 1]
        cut = bisect.bisect_right(DURATION_BUCKETS, 0.6 * statistics_median(longs))
        # The steps well above the bound (1.5x: at least the 3 longs at or above their median, which is 1.67x or
        # more) are all seen above it: a step's dating moves its time by a GIL switch or so (5 ms), onto a neighbour
        # at worst, never a long step's time below the bound. Steps near the bound may cross it either way.
        bound = DURATION_BUCKETS[cut - 1]
        above = sum(1 for d in truth if d > 1.5 * bound)
        assert above >= 3 and mine[-1] - mine[cut - 1] >= above - 1, (mine, theirs, cut, above)


def looks(tracker: Tracker) -> int:
    return tracker.waiter.looks


def statistics_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
