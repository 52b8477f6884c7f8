"""When each step of a segment completed: the device as a FIFO queue. Pure arithmetic, tested on literals.

A device runs a loop's steps in order, each once it was handed and the step before it completed: step k completes a
service time after the later of its hand-off and step k - 1's completion. The waiter observes at most one completion
a look (docs/training.md, "How a step is measured"); these functions place the others from what was observed: the
hand-offs, the segment's start (the completion before it) and its end, and, for a loop its device paces, the host's
own calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# A device-paced segment whose last step is longer than this many of its mean steps is not dated by the host's calls
# (they are then no rhythm of its device's: a loaded machine's late wake, a host that ran ahead).
LAST_STEPS = 6


def queue(start: float, handed: Sequence[float], service: float) -> list[float]:
    """The completions of steps handed at `handed` on a device free from `start`, each taking `service`."""
    if len(handed) == 1:
        return [max(handed[0], start) + service]
    k = np.arange(len(handed))
    # c_k = max(start, max_{j <= k}(h_j - j s)) + (k + 1) s: the queue's recurrence as a running maximum.
    ahead = np.maximum(np.maximum.accumulate(np.asarray(handed, dtype=float) - k * service), start)
    dates: list[float] = (ahead + (k + 1) * service).tolist()
    return dates


def fit(start: float, handed: Sequence[float], end: float) -> float:
    """The service time with which the queue completes the last of the steps handed at `handed` at `end`: the
    largest with which none completes later (every line of the running maximum meets `end` or stays below it)."""
    n = len(handed)
    left = n - np.arange(n)
    service = min((end - start) / n, float(np.min((end - np.asarray(handed, dtype=float)) / left)))
    return max(service, 0.0)


class Dates(list[float]):
    """A segment's completions; `paced`: dated by the host's calls (each an observed completion), not the queue."""

    paced = False


def apportion(
    start: float,
    end: float,
    handed: Sequence[float],
    later: Sequence[float] = (),
    ran: bool = True,
    paced: bool = True,
    busy: float = 0.0,
    marked: float | None = None,
    lead: int | None = None,
) -> Dates:
    """The completions of consecutive steps handed at `handed` whose segment starts at `start` (the completion before
    it) and ends by `end`: when the waiter saw the last one complete (`ran`), or when it looked and found it done.

    - `paced` (the device was behind the host at recent looks) and `later` (the host's calls after the last step,
      before `end`: its lead): a host its device paces calls step k + lead + 1 right after step k completed, so
      each of those calls observes a completion. Used where they fit the segment: the first no earlier than a mean
      step before `start`, the last after it (calls all made before the completion they would date are a host that
      ran ahead, not one its device paced), the last step no longer than LAST_STEPS mean steps.
    - Otherwise the queue: its service time fitted so that the last step completes at `end` where that was seen, or
      at a mark (`marked`: the host stopped stepping then) handed after a backlog (the host waited for its device);
      else a typical step's observed service (`busy`), taken down where it would put the last step after `end`.
      Where the last was not seen, `lead` (the most steps the host was seen ahead of its device at recent looks)
      bounds the queue: step k was done by the host's call k + lead + 1 (a service fitted to a pause's end, or a
      typical step of a busier minute, would pile them up into the pause: a lead no look saw).
    Non-decreasing, within [start, end]."""
    n = len(handed)
    step = (end - start) / n
    if paced and n > 1 and (ran or not busy):
        calls = [*handed, *later][len(later) + 1 : len(later) + n]
        if calls[0] >= start - step and calls[-1] > start and end - calls[-1] <= LAST_STEPS * step:
            dates = Dates(np.minimum(np.maximum.accumulate(np.maximum(calls, start)), end).tolist())
            previous = dates[-1]
            dates.append(end if ran else min(end, max(handed[-1], previous) + (previous - start) / (n - 1)))
            dates.paced = True
            return dates
    if not ran and marked is not None and busy and n > 1 and queue(start, handed[:-1], busy)[-1] > handed[-1]:
        end, ran = max(min(end, marked), start), True
    service = fit(start, handed, end)
    if not ran and busy:
        service = min(service, busy)
    dates = Dates(min(date, end) for date in queue(start, handed, service))
    if lead is not None and not ran and n > lead + 1:
        cut = n - lead - 1
        bound = np.maximum(np.maximum.accumulate(np.asarray(handed[lead + 1 :], dtype=float)), start)
        head: list[float] = np.minimum(dates[:cut], bound).tolist()
        dates = Dates([*head, *(min(date, end) for date in queue(head[-1], handed[cut:], service))])
    if ran:
        dates[-1] = end
    return dates
