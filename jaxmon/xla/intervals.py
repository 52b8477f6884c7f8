"""Unions of time intervals, and the split of a window into compute, exposed collective, copy and idle time.

Summing op durations double-counts what runs at once on several streams or threads (marin-community/marin#8053: a
claimed 3.17 s bubble was 1.02 s of exposed collectives); every figure here is the length of a union of intervals.
Times are integer picoseconds, so the four parts of a window sum to it exactly. Everything is O(n log n): one sort,
one pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["COLLECTIVE", "COMPUTE", "COPY", "Segment", "Split", "innermost", "split", "union_length"]

# The classes of device activity, in their order of precedence: at each instant the device's time goes to the first
# class with something running, else to idle.
COMPUTE, COLLECTIVE, COPY = 0, 1, 2

# (start_ps, end_ps, class, collective kind or "")
Segment = tuple[int, int, int, str]


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    """The length of the union of [start, end) intervals (empty or reversed ones count nothing)."""
    total = 0
    cur_start = cur_end = None
    for start, end in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def innermost(events: Iterable[Segment]) -> list[Segment]:
    """One timeline's events, possibly nested (a `while` op holding its body's ops on a TPU's "XLA Ops" line, a
    thunk inside another on a CPU thread), as disjoint segments where each instant belongs to the innermost event
    covering it: a collective inside a loop counts as the collective, the loop's own time as the loop.

    XLine's contract is that events nest or do not overlap; an event that outlives its parent (clock jitter) is cut
    at the parent's end.
    """
    out: list[Segment] = []
    stack: list[Segment] = []  # open events, outermost first; their ends never grow up the stack
    cursor = 0
    for start, end, cls, op in sorted(events, key=lambda e: (e[0], -e[1])):
        if end <= start:
            continue
        while stack and stack[-1][1] <= start:
            top = stack.pop()
            if top[1] > cursor:
                out.append((cursor, top[1], top[2], top[3]))
                cursor = top[1]
        if stack:
            parent = stack[-1]
            if start > cursor:
                out.append((cursor, start, parent[2], parent[3]))
            end = min(end, parent[1])
        cursor = start
        stack.append((start, end, cls, op))
    while stack:
        top = stack.pop()
        if top[1] > cursor:
            out.append((cursor, top[1], top[2], top[3]))
            cursor = top[1]
    return out


@dataclass
class Split:
    """A window's time on one device, in picoseconds: `compute + collective + copy + idle == window`.

    `collective` is exposed communication (a collective running and no compute); `collectives` is the union time of
    each collective kind, overlapped with compute or not; `exposed` each kind's time with no compute running (kinds
    running at once each count it: their sum is at least `collective`); `events` the collective segments of each
    kind that start inside the window (one per op event: a collective nests no op of its own); `copies` each copy
    kind's time with nothing else running (the `copy` part by kind; kinds running at once each count it) and
    `copy_events` the copy segments of each kind that start inside the window.
    """

    window: int
    compute: int = 0
    collective: int = 0
    copy: int = 0
    idle: int = 0
    collectives: dict[str, int] = field(default_factory=dict)
    exposed: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    copies: dict[str, int] = field(default_factory=dict)
    copy_events: dict[str, int] = field(default_factory=dict)


def split(segments: Iterable[Segment], t0: int, t1: int) -> Split:
    """Split [t0, t1) by precedence (compute, then collective, then copy, else idle) over segments from any number
    of overlapping timelines (streams, threads) of one device, clipped to the window."""
    if t1 < t0:
        raise ValueError(f"window ends ({t1}) before it starts ({t0})")
    points: list[tuple[int, int, int, str]] = []
    kinds: dict[str, list[tuple[int, int]]] = defaultdict(list)
    events: dict[str, int] = {}
    copy_events: dict[str, int] = {}
    for start, end, cls, op in segments:
        if cls == COLLECTIVE and t0 <= start < t1:
            events[op] = events.get(op, 0) + 1
        elif cls == COPY and t0 <= start < t1:
            copy_events[op] = copy_events.get(op, 0) + 1
        start, end = max(start, t0), min(end, t1)
        if end <= start:
            continue
        points.append((start, 1, cls, op))
        points.append((end, -1, cls, op))
        if cls == COLLECTIVE:
            kinds[op].append((start, end))
    points.sort()
    running = [0, 0, 0]
    parts = [0, 0, 0, 0]  # compute, collective, copy, idle
    collectives: dict[str, int] = {}  # the collective kinds running now, and how many of each
    exposed: dict[str, int] = {}
    copying: dict[str, int] = {}  # the copy kinds running now, and how many of each
    copies: dict[str, int] = {}
    prev = t0
    for t, delta, cls, op in points:
        if t > prev:
            if running[COMPUTE]:
                parts[COMPUTE] += t - prev
            elif running[COLLECTIVE]:
                parts[COLLECTIVE] += t - prev
                for kind, count in collectives.items():
                    if count:
                        exposed[kind] = exposed.get(kind, 0) + t - prev
            elif running[COPY]:
                parts[COPY] += t - prev
                for kind, count in copying.items():
                    if count:
                        copies[kind] = copies.get(kind, 0) + t - prev
            else:
                parts[3] += t - prev
            prev = t
        running[cls] += delta
        if cls == COLLECTIVE:
            collectives[op] = collectives.get(op, 0) + delta
        elif cls == COPY:
            copying[op] = copying.get(op, 0) + delta
    parts[3] += t1 - prev
    unions = {op: union_length(iv) for op, iv in kinds.items()}
    return Split(t1 - t0, parts[0], parts[1], parts[2], parts[3], unions, exposed, events, copies, copy_events)
