"""Unions and the precedence split, on hand-made intervals and against a brute-force count of every picosecond."""

from __future__ import annotations

import random

import pytest

from jaxmon.xla.intervals import COLLECTIVE, COMPUTE, COPY, Segment, innermost, split, union_length


def test_union_counts_overlaps_once() -> None:
    assert union_length([(0, 10), (5, 15), (20, 30), (25, 26), (30, 31), (40, 40), (50, 45)]) == 26
    assert union_length([]) == 0


def test_split_by_precedence() -> None:
    segments: list[Segment] = [
        (0, 30, COMPUTE, ""),
        (20, 50, COLLECTIVE, "all-reduce"),  # exposed on [30, 50)
        (45, 70, COPY, ""),  # copy only on [50, 60)
        (60, 80, COLLECTIVE, "all-gather"),  # wins over the copy on [60, 70)
    ]
    s = split(segments, 0, 100)
    assert (s.compute, s.collective, s.copy, s.idle) == (30, 20 + 20, 10, 20)
    assert s.collectives == {"all-reduce": 30, "all-gather": 20}
    assert s.compute + s.collective + s.copy + s.idle == s.window == 100
    # exposed: each kind's time with no compute running; events: its segments starting in the window
    assert s.exposed == {"all-reduce": 20, "all-gather": 20} and s.events == {"all-reduce": 1, "all-gather": 1}


def test_kinds_running_at_once_each_count_their_exposed_time() -> None:
    segments: list[Segment] = [
        (0, 40, COLLECTIVE, "a"),
        (10, 30, COLLECTIVE, "b"),
        (20, 25, COMPUTE, ""),
        (50, 60, COLLECTIVE, "a"),
    ]
    s = split(segments, 5, 55)
    assert s.collective == 35 + 5 - 5  # [5, 40) and [50, 55) less the compute's [20, 25)
    assert s.exposed == {"a": 30 + 5, "b": 15}  # b: [10, 30) less [20, 25)
    assert s.events == {"a": 1, "b": 1}  # a's first event started before the window


def test_split_clips_to_the_window() -> None:
    s = split([(0, 30, COMPUTE, ""), (20, 50, COLLECTIVE, "all-reduce")], 25, 45)
    assert (s.window, s.compute, s.collective, s.copy, s.idle) == (20, 5, 15, 0, 0)
    assert s.collectives == {"all-reduce": 20}
    empty = split([(0, 30, COMPUTE, "")], 40, 40)
    assert (empty.window, empty.compute, empty.idle) == (0, 0, 0)
    with pytest.raises(ValueError, match="before it starts"):
        split([], 10, 5)


def test_innermost_gives_each_instant_to_the_innermost_event() -> None:
    loop = [
        (20, 60, COMPUTE, ""),  # a while op
        (22, 40, COMPUTE, ""),  # its body: a convolution
        (40, 55, COLLECTIVE, "all-reduce"),  # and an all-reduce
        (0, 20, COMPUTE, ""),
        (60, 70, COPY, ""),
    ]
    assert innermost(loop) == [
        (0, 20, COMPUTE, ""),
        (20, 22, COMPUTE, ""),
        (22, 40, COMPUTE, ""),
        (40, 55, COLLECTIVE, "all-reduce"),
        (55, 60, COMPUTE, ""),
        (60, 70, COPY, ""),
    ]
    # A child that outlives its parent is cut at the parent's end; zero-length events vanish.
    assert innermost([(0, 10, COMPUTE, ""), (5, 15, COLLECTIVE, "x"), (12, 12, COPY, "")]) == [
        (0, 5, COMPUTE, ""),
        (5, 10, COLLECTIVE, "x"),
    ]


def _brute(segments: list[Segment], t0: int, t1: int) -> tuple[list[int], dict[str, int]]:
    parts = [0, 0, 0, 0]
    kinds: dict[str, int] = {}
    for t in range(t0, t1):
        here = [(cls, op) for s, e, cls, op in segments if s <= t < e]
        classes = {cls for cls, _ in here}
        parts[min(classes) if classes else 3] += 1
        for op in {op for cls, op in here if cls == COLLECTIVE}:
            kinds[op] = kinds.get(op, 0) + 1
    return parts, kinds


def test_split_equals_a_count_of_every_instant() -> None:
    rng = random.Random(34)
    for _ in range(200):
        segments: list[Segment] = []
        for _ in range(rng.randint(0, 12)):
            start = rng.randint(-20, 120)
            cls = rng.choice([COMPUTE, COLLECTIVE, COPY])
            op = rng.choice(["all-reduce", "all-gather"]) if cls == COLLECTIVE else ""
            segments.append((start, start + rng.randint(0, 40), cls, op))
        t0 = rng.randint(-10, 50)
        t1 = t0 + rng.randint(0, 100)
        s = split(segments, t0, t1)
        parts, kinds = _brute(segments, t0, t1)
        assert [s.compute, s.collective, s.copy, s.idle] == parts, segments
        assert s.collectives == kinds
