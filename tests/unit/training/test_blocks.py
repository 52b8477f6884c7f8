"""Which blocks a sampled trace holds (jaxmon.training.blocks): off the steps named badput marks, by step numbers
alone. A loop is simulated as the tracker tells the sampler of it: each step number handed, and each badput
interval with the last step number handed when it opened (or was recorded) and closed."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from jaxmon.training.blocks import LEAD, MAX_RETRIES, Blocks, block_start

# After handing step h: the badput the loop runs, as (kind, "block") (a badput() block, opened and closed there)
# or (kind, "event") (a compilation or an Orbax save, recorded whole).
Events = Callable[[int], Iterable[tuple[str, str]]]


def simulate(every: int, steps: int, handed: int, events: Events) -> tuple[list[int], list[int]]:
    """The blocks whose samples are taken and those dropped, over steps 0 to `handed` - 1 handed in order; a sample
    ends as soon as its block is marked, else once its last step was handed."""
    blocks = Blocks(every, steps)
    taken: list[int] = []
    skipped: list[int] = []
    current: int | None = None
    for h in range(handed):
        n0 = block_start(h, every)
        if n0 is None and h + LEAD == blocks.retry:
            n0 = h + LEAD
        if n0 is not None and current is None:
            if blocks.begin(n0):
                current = n0
            else:
                skipped.append(n0)
                blocks.finish(n0)
        for kind, how in events(h):
            key = object()
            blocks.opened(kind, key, h, how == "event")
            if how == "block":
                blocks.closed(key, h)
        if current is not None and (blocks.marked(current) or h >= current + steps - 1):
            (skipped if blocks.marked(current) else taken).append(current)
            blocks.finish(current)
            current = None
    return taken, skipped


def eval_and_save(h: int) -> list[tuple[str, str]]:
    """An eval every 10 steps and an Orbax save every 20, both right after steps 9, 19, 29, ... were handed."""
    out = []
    if (h + 1) % 10 == 0:
        out.append(("eval", "block"))
    if (h + 1) % 20 == 0:
        out.append(("checkpoint", "event"))
    return out


def marked_steps(events: Events, handed: int) -> set[int]:
    """Steps whose window holds the badput: the one handed after it."""
    return {h + 1 for h in range(handed) if events(h)}


def test_a_sample_moves_off_the_eval_and_the_save_and_every_move_is_counted() -> None:
    taken, skipped = simulate(20, 2, 206, eval_and_save)
    assert skipped == list(range(20, 201, 20))  # every regular block: the eval and the save run right before it
    assert taken == [n0 + 4 for n0 in skipped]  # each tried again 4 steps on (22 rounded to a multiple of 4)
    marked = marked_steps(eval_and_save, 206)
    assert all(not marked & set(range(n0, n0 + 2)) for n0 in taken)


def test_without_badput_the_blocks_are_the_multiples_of_every() -> None:
    taken, skipped = simulate(20, 2, 200, lambda h: [])
    assert (taken, skipped) == (list(range(20, 200, 20)), [])
    compiles = simulate(20, 2, 200, lambda h: [("compile", "event")] if h in (0, 1) else [])
    assert compiles == (list(range(20, 200, 20)), [])  # the first steps' compilations are far from any block


def test_a_badput_of_every_step_is_the_loops_steady_state_not_a_reason_to_move() -> None:
    """A `badput("data")` around each step's batch marks every step: samples show it, as the loop runs."""
    data = simulate(20, 2, 100, lambda h: [("data", "block")])
    assert data == ([20, 40, 60, 80], [])
    with_eval = simulate(20, 2, 100, lambda h: [("data", "block")] + ([("eval", "block")] if h == 39 else []))
    assert with_eval == ([20, 44, 60, 80], [40])


def test_a_block_handed_inside_an_open_badput_is_tried_after_it_closed() -> None:
    """Steps 18 to 25 are handed inside one badput() block (opened after 17, closed after 25): block 20 is dropped
    without a trace, and tried at 28, the first multiple of 4 whose trace starts after the close."""
    blocks = Blocks(20, 2)
    key = object()
    blocks.opened("eval", key, 17, whole=False)
    assert block_start(18, 20) == 20 and not blocks.begin(20)
    blocks.finish(20)
    assert blocks.retry is None  # not before it closes
    blocks.closed(key, 25)
    assert blocks.retry == 28
    assert blocks.begin(28) and not blocks.marked(28)


def test_retries_stop_after_max_retries_and_at_the_next_regular_block() -> None:
    """An eval every 4 steps marks every multiple of 4: block 40 and its retries 44, 48, 52 are dropped, then
    nothing until block 80; a retry never reaches past the next regular block."""
    every4 = simulate(40, 2, 100, lambda h: [("eval", "block")] if (h + 1) % 4 == 0 else [])
    assert every4 == ([], [40, 44, 48, 52, 80, 84, 88, 92][: 2 * (MAX_RETRIES + 1)])
    late = simulate(20, 2, 60, lambda h: [("eval", "block")] if h == 37 else [])  # marks 38: retry 40 is regular
    assert late == ([20, 40], [])
    blocks = Blocks(20, 2)
    assert blocks.begin(36)
    blocks.opened("eval", object(), 36, whole=True)  # marks 37: the retry would be 40, the next regular block
    assert blocks.marked(36) and blocks.retry is None


def test_a_trace_asked_for_early_is_marked_only_by_badput_that_reaches_its_block() -> None:
    """A profiler slow to start: traces are asked for 4 steps ahead (the sampler's lead). Block 40's trace is asked
    for as step 36 is handed; an eval after step 36 marks step 37 only, and the block stays clean, while one opened
    after step 38 that closes after step 40 was handed reaches steps 39 to 41: the block is marked at its close."""
    blocks = Blocks(20, 2)
    blocks.lead = 4
    assert blocks.begin(40)
    early = object()
    blocks.opened("eval", early, 36, whole=False)
    assert not blocks.marked(40) and blocks.held(40)  # open: it may still reach the block
    blocks.closed(early, 36)
    assert not blocks.held(40) and blocks.retry is None
    late = object()
    blocks.opened("eval", late, 38, whole=False)
    assert not blocks.marked(40)
    blocks.closed(late, 40)
    assert blocks.marked(40) and blocks.retry == 44  # the first multiple of 4 at least 2 past step 41
    blocks.finish(40)
    # The retry must end before the next regular block's trace is asked for, `lead` steps ahead of it: a badput that
    # marks step 53 would retry at 56, whose trace runs past step 56 = 60 - 4.
    blocks = Blocks(20, 2)
    blocks.lead = 4
    assert blocks.begin(52)
    blocks.opened("eval", object(), 52, whole=True)  # marks 53
    assert blocks.marked(52) and blocks.retry is None
    blocks = Blocks(20, 2)
    assert blocks.begin(52)
    blocks.opened("eval", object(), 52, whole=True)
    assert blocks.retry == 56  # at the default lead, 56 and 57 end before step 58 asks for block 60
