"""When each step of a waiter's batch completed: pure arithmetic on the tracker's clock, tested on literals.

The waiter (waiter.py) sees one step of a batch complete, the newest, and knows when the host handed each step to
`step()`; these place the others (docs/training.md, "How a step is measured").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jaxmon.training.accounting import VECTOR_STEPS

# How many times chain() takes a typical step's time down to fit a batch into its interval (each a pass over it).
FITS = 4


def chain(
    handed: Sequence[float], start: float | None, busy: float, now: float, fit: bool = False, kept_up: bool = False
) -> list[float]:
    """The completions of consecutive steps handed at `handed` that no completion bounds (the loop paused or ended
    after them, or its device kept up): in order, each a typical step's device time (`busy`) after the one before it
    (the first after `start`, the last completion booked) or after its own hand-off if later, no later than `now`;
    with nothing known before them (`start` None), each at its hand-off. `fit`: the last one completed by `now` (it
    was seen done): where `busy` puts it later, `busy` is over these steps' own (the window's median, a little over
    the host's rhythm), and a step's excess would carry on from step to step and, over a look of a thousand steps,
    pile the last hundreds at `now` as steps of no time; `busy` is taken down until they fit. `kept_up`: the host
    handed each after the one before completed (a loop that waits for its steps): each no later than the next call."""
    if start is None:
        return [min(at, now) for at in handed]
    bounds = [*handed[1:], math.inf] if kept_up else [math.inf] * len(handed)
    dates = _queued(handed, start, busy, bounds)
    for _ in range(FITS if fit else 0):
        if not dates or dates[-1] <= now or busy <= 0:
            break
        busy *= max(now - start, 0.0) / (dates[-1] - start)  # the span they had over the span they would take
        dates = _queued(handed, start, busy, bounds)
    return [min(date, now) for date in dates]


def _queued(handed: Sequence[float], start: float, busy: float, bounds: Sequence[float]) -> list[float]:
    """Each step `busy` after its hand-off, or after the one before it if that completed later (a queue), no later
    than its bound."""
    dates = []
    previous = start
    for at, bound in zip(handed, bounds, strict=True):
        previous = min(max(at, previous) + busy, bound)
        dates.append(previous)
    return dates


def apportion(
    start: float,
    end: float,
    handed: Sequence[float],
    later: Sequence[float],
    ran: bool = True,
    paced: bool = True,
    busy: float = 0.0,
    marked: float | None = None,
) -> list[float]:
    """The completions of consecutive steps handed at `handed`, the one before the first completed at `start`;
    `end`: when the waiter saw the last one complete, `ran`: whether it still ran when the waiter looked (else it
    completed before `end`); `later`: when the steps handed after the last one, before `end`, were (the host's
    lead); `paced`: whether the device was behind the host at recent looks; `busy`: a step's typical device time,
    for steps that completed unseen (not `ran`); `marked`: when the host handed a mark after the last one (it stopped
    stepping then). Non-decreasing, within [start, end]."""
    n = len(handed)
    if n == 1:  # the completion seen; one done already (not ran): a typical step after it could start
        return [end if ran else min(end, max(start, handed[0]) + busy)]
    if not ran and marked is not None and busy and handed[-1] - handed[0] < (n - 1) * busy / 2:
        # A burst the host handed, then waited for before it stopped (Keras's epoch end): the device ran them back
        # to back, and the last was done when the mark came. Shared evenly up to then: a typical step's time, off by
        # a little, would carry on over the burst and move its end.
        end = max(min(end, marked), start)
        return [start + (end - start) * (i + 1) / n for i in range(n)]
    if not ran and (not paced or busy) and handed[0] >= start - busy:  # the device kept up: done once handed
        burst = handed[-1] - handed[0] < (n - 1) * busy / 2  # faster than its device: no call waited for a step
        return chain(handed, start, busy, end, fit=True, kept_up=not burst)
    times = [*handed, *later]
    shift = len(later) + 1  # a paced loop calls step() for step k + shift right after step k completed
    bounds = times[shift : shift + n - 1]
    # Not paced by the device: the host's calls came before the interval began, or in a burst long before its end
    # (it ran ahead): no rhythm of the device's to follow. Shared from the first hand-off where that came after
    # `start` (the loop paused before the batch): the device had nothing to run until then.
    if bounds[0] < start - (end - start) / n / 2 or end - bounds[-1] > 6 * (end - start) / n:
        first = min(max(start, handed[0]), end)
        span = (end - first) / n
        return [first + span * (i + 1) for i in range(n - 1)] + [end]
    out: list[float]
    if n >= VECTOR_STEPS:  # the loop below, as NumPy: a running maximum from `start`, no later than `end`
        out = np.minimum(np.maximum.accumulate(np.maximum(bounds, start)), end).tolist()
        previous = out[-1]
    else:
        out, previous = [], start
        for bound in bounds:
            previous = min(max(bound, previous), end)
            out.append(previous)
    if not ran:  # it completed before the look (the loop paused): a typical step after the one before it
        end = min(end, previous + (previous - start) / (n - 1))
    out.append(end)
    return out
