"""The totals the waiter adds each batch of steps to, and how a batch's steps are read before they count.

The tracker's waiter books steps in batches (waiter.py): the per-step part is a few operations in the tracker's
loop; what a batch's steps share is added here once a batch: the programs' FLOPs and bytes per device, the
collective bytes, the window of predicted peak memory, the examples, tokens and model FLOPs. A step's FLOPs per
device is one mapping per figure or set of tracked calls, kept and handed to the accounting by reference (its window
counts mappings, not devices). Written by the waiter under the tracker's lock; read by the tracker's reading().
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxmon.catalog.hardware import nominal_bandwidth as per_link
from jaxmon.device_readings import DeviceInfo
from jaxmon.training.accounting import Accounting, Intervals
from jaxmon.training.communication import WindowMax, book
from jaxmon.training.handed import Program
from jaxmon.training.steps import INT, Handoff, Hold, Run, Step, columns, read_figures
from jaxmon.training_readings import DeviceTraining

# A step's FLOPs per device when it gave none (shared: never written to).
NO_FLOPS: Mapping[tuple[str, int], float] = {}
# The sets of tracked calls whose FLOPs per device are kept (a loop runs a few: emptied when full).
MAX_PROFILES = 256
# The loss gauge is read at most this often (seconds): a copy of a few scalars to the host each time.
LOSS_EVERY = 1.0
# The largest figure counted as given (a larger int would overflow a float sum: read_figures says why it is not).
BIG = 1e300
# What a batch booked: the numbers and completions of the steps seen complete (columns: no tuple a step), its model
# FLOPs, the hardware FLOPs it added per device.
Entered = tuple[Sequence[int], Sequence[float], float, dict[tuple[str, int], float]]
# A step's number and figures as read: (number, examples, tokens, model_flops), the number None when unusable.
Read = tuple[Any, Any, Any, Any]


def usable(figure: Any) -> bool:
    """Whether a host figure counts as given: None, or a finite int or float >= 0."""
    return figure is None or ((type(figure) is int or type(figure) is float) and 0 <= figure <= BIG)


def steady(column: tuple[Any, ...]) -> bool:
    """Whether a batch's figure (a column of its hand-offs) is the same usable one, of the same type, at every step."""
    first = column[0]  # usable first: each a host number, compared by value (never an array's ==)
    return usable(first) and len(set(map(type, column))) == 1 and column.count(first) == len(column)


def counted(programs: Sequence[Program]) -> list[tuple[Program, int]]:
    """A step's tracked calls (one entry a call) as (program, calls)."""
    if len(programs) == 1:
        return [(programs[0], 1)]
    out: dict[int, tuple[Program, int]] = {}
    for program in programs:
        out[id(program)] = (program, out.get(id(program), (program, 0))[1] + 1)
    return list(out.values())


class Books:
    """A training process's totals since its tracker started (the waiter adds to them under the tracker's lock)."""

    def __init__(self, devices: list[DeviceInfo], device_count: int, process_count: int, window: int) -> None:
        self._devices = devices
        self._device_count = device_count
        self._process_count = process_count
        self.steps = 0
        self.last: tuple[int, float | None] | None = None  # (number, completion) of the last step booked
        self.last_wall: float | None = None
        self.seen: float | None = None  # the tracker's clock when the waiter last saw a step end
        self.examples = 0.0
        self.tokens = 0.0
        self.model: dict[tuple[str, int], float] = {}
        self.hardware: dict[tuple[str, int], float] = {}
        self.bytes: dict[tuple[str, int], float] = {}
        self.collectives: dict[tuple[str, int], dict[tuple[str, str, str], float]] = {}  # (op, axes, link)
        self.peak_memory = WindowMax(window)  # the largest predicted peak of the window's steps' programs
        self.waiting: dict[int, tuple[Program, int]] = {}  # calls of programs not analysed yet (communication.book)
        self.loss: dict[str, float] = {}  # the loss gauge: the last read looked-at step's scalars, by name
        self.loss_step: int | None = None  # the step they are of
        self.loss_read = -float("inf")  # when the loss was last read (the tracker's clock)
        self._model_last: tuple[float, Mapping[tuple[str, int], float]] = (-1.0, {})
        self._profiles: dict[Any, Mapping[tuple[str, int], float]] = {}

    def model_share(self, flops: float) -> Mapping[tuple[str, int], float]:
        """Each local device's share of a step's model FLOPs (the same mapping for the same figure)."""
        if flops != self._model_last[0]:
            share = flops / self._device_count
            self._model_last = (flops, {d.key: share for d in self._devices})
        return self._model_last[1]

    def hardware_of(self, calls: Sequence[Program]) -> Mapping[tuple[str, int], float]:
        """XLA's FLOPs per device of a step that made these tracked calls (one mapping per set of calls, kept)."""
        key: Any = calls[0] if len(calls) == 1 else tuple(calls)
        known = self._profiles.get(key)
        if known is None:
            flops: dict[tuple[str, int], float] = {}
            for program, count in counted(calls):
                cost = program.cost
                if cost is None or cost.flops is None:
                    continue
                for device in cost.devices:
                    flops[device] = flops.get(device, 0.0) + cost.flops * count
            if len(self._profiles) >= MAX_PROFILES:
                self._profiles.clear()
            known = self._profiles[key] = flops
        return known

    def enter(
        self,
        acct: Accounting,
        intervals: Intervals,
        batch: list[Handoff],
        done: list[float | None],
        slow: dict[int, Read],
        problem: Callable[..., None],
    ) -> Entered:
        """A batch of the waiter's steps (`done`: their completions, None where unknown; `slow`: the ones read_slow
        read) booked into `acct` and these totals (under the tracker's lock): (the numbers and the completions of
        those seen complete, the batch's model FLOPs, the hardware FLOPs added per device)."""
        if not slow and not intervals and batch and acct.last_done is not None:
            run = self._run(acct, batch, done)
            if run is not None:
                return run
        counts: dict[Program, int] = {}
        examples = tokens = model_total = 0.0
        seen: list[int] = []  # the steps seen complete: their numbers and completions
        seen_at: list[float] = []
        last, booked = self.last, 0
        last_n, last_c = last if last is not None else (None, None)
        # The figure and the single tracked program of the steps before: their FLOPs mappings are the same.
        last_mf: Any = None
        model: Mapping[tuple[str, int], float] = NO_FLOPS
        single: Program | None = None
        singles, single_hw = 0, NO_FLOPS
        # A run of steps that follow each other with no interval to charge and the same FLOPs: booked in one pass.
        run_done: list[float] = []
        run_handed: list[float] = []
        run_from, run_model, run_hw = 0.0, NO_FLOPS, NO_FLOPS
        for item, completion in zip(batch, done, strict=True):
            handed, number, ex, tok, mf, calls, _ = item
            if slow and id(item) in slow:
                number, ex, tok, mf = slow[id(item)]
                if number is None:  # no step number to book it under (counted): its time goes to the next gap
                    continue
            booked += 1
            if ex is not None:
                examples += ex
            if tok is not None:
                tokens += tok
            if mf is not last_mf:
                last_mf, model = mf, NO_FLOPS if mf is None else self.model_share(mf)
            if mf is not None:
                model_total += mf
            if not calls:
                hardware = NO_FLOPS
            elif len(calls) == 1 and calls[0] is single:
                singles += 1
                hardware = single_hw
            else:
                if singles:
                    counts[single] = counts.get(single, 0) + singles  # type: ignore[index,arg-type]
                    singles = 0
                hardware = self.hardware_of(calls)
                if len(calls) == 1:
                    single, singles, single_hw = calls[0], 1, hardware
                else:
                    single = None
                    for program in calls:
                        counts[program] = counts.get(program, 0) + 1
            previous_n, previous_c = last_n, last_c
            last_n, last_c = number, completion
            if completion is None:
                continue
            seen.append(number)
            seen_at.append(completion)
            before = previous_c if previous_n is not None and number == previous_n + 1 else None
            if before is not None and not intervals and (acct.last_done is not None or run_done):
                if run_done and (model is not run_model or hardware is not run_hw):
                    acct.steps(run_from, run_done, run_handed, run_model, run_hw)
                    run_done, run_handed = [], []
                if not run_done:
                    run_from, run_model, run_hw = before, model, hardware
                run_done.append(completion)
                run_handed.append(handed)
                continue
            if run_done:
                acct.steps(run_from, run_done, run_handed, run_model, run_hw)
                run_done, run_handed = [], []
            if acct.last_done is None:
                acct.first(completion, intervals)
            elif before is not None:
                acct.step(before, completion, handed, intervals, model, hardware)
            else:
                # Since the last known completion: steps not seen complete (unready), or numbers that do not follow.
                restart = previous_n is not None and number <= previous_n
                if previous_n is not None and number != previous_n + 1:
                    reason = "back" if restart else "jump"
                    problem(reason, "training step numbers do not follow", previous=previous_n, number=number)
                acct.gap(acct.last_done, completion, intervals, restart)
                if restart:  # every window starts again: the MFU's (in gap()) and the predicted peak memory's
                    self.peak_memory.clear()
        if run_done:
            acct.steps(run_from, run_done, run_handed, run_model, run_hw)
        if singles:
            counts[single] = counts.get(single, 0) + singles  # type: ignore[index,arg-type]
        if not booked or last_n is None:
            return seen, seen_at, model_total, {}
        self.last = (last_n, last_c)
        return seen, seen_at, model_total, self.add(booked, counts, examples, tokens, model_total)

    def run(self, acct: Accounting, intervals: Intervals, run: Run, done: list[float]) -> Entered | None:
        """The waiter's common batch (steps.Run: host numbers on from the last one booked, the same figures and calls
        at each step), every step dated, booked as one run with no per-step work here; None (nothing booked) where it
        is not that here: a badput interval to charge, no step booked yet, a number that does not follow the last
        booked, a figure that is no usable number (enter() books it step by step)."""
        last = self.last
        if (
            intervals
            or acct.last_done is None
            or last is None
            or last[1] is None
            or run.first != last[0] + 1
            or not (usable(run.examples) and usable(run.tokens) and usable(run.model_flops))
        ):
            return None
        return self._book_run(acct, last[1], run, done)

    def _run(self, acct: Accounting, batch: list[Handoff], done: list[float | None]) -> Entered | None:
        """The common batch booked with no per-step work here: every step seen complete, numbered on from the last
        one booked, with the same figures and the same tracked calls as the others (a steady loop). None when the
        batch is not that (enter() books it step by step). The checks are C loops over the batch's columns."""
        last = self.last
        if last is None or last[1] is None or None in done:
            return None
        handed, numbers, examples, tokens, flops, calls, _ = columns(batch)
        n, first = len(batch), numbers[0]
        if not (
            type(first) is int  # read_slow left only host ints and usable figures: the columns need no other check
            and first == last[0] + 1
            and numbers == tuple(range(first, first + n))
            and examples.count(examples[0]) == n
            and tokens.count(tokens[0]) == n
            and flops.count(flops[0]) == n
            and calls.count(calls[0]) == n
        ):
            return None
        run = Run(list(handed), first, examples[0], tokens[0], flops[0], calls[0], [])
        return self._book_run(acct, last[1], run, done)  # type: ignore[arg-type]  # None not in done

    def _book_run(self, acct: Accounting, before: float, run: Run, done: list[float]) -> Entered:
        """`run`'s steps, numbered on from the last one booked (completed at `before`), booked as one run."""
        numbers, n, mf, programs = run.numbers, len(run.handed), run.model_flops, run.programs
        model = NO_FLOPS if mf is None else self.model_share(mf)
        hardware = self.hardware_of(programs) if programs else NO_FLOPS
        acct.steps(before, done, run.handed, model, hardware)
        self.last = (numbers[-1], done[-1])
        model_total = 0.0 if mf is None else mf * n
        counts = {program: count * n for program, count in counted(programs)} if programs else {}
        added = self.add(
            n,
            counts,
            0.0 if run.examples is None else run.examples * n,
            0.0 if run.tokens is None else run.tokens * n,
            model_total,
        )
        return numbers, done, model_total, added

    def add(
        self, booked: int, counts: Mapping[Program, int], examples: float, tokens: float, model: float
    ) -> dict[tuple[str, int], float]:
        """A batch's `booked` steps, their tracked calls per program, and their figures (the job's): this process's
        share added; returns the hardware FLOPs added per device."""
        self.steps += booked
        # step() is given the job's figures: this process's share, so that sum() over the job is the job's.
        self.examples += examples / self._process_count
        self.tokens += tokens / self._process_count
        if model:
            share = model / self._device_count
            for d in self._devices:
                self.model[d.key] = self.model.get(d.key, 0.0) + share
        added: dict[tuple[str, int], float] = {}
        for program, count in counts.items():
            cost = program.cost
            if cost is None:
                continue
            for device in cost.devices:
                if cost.flops is not None:
                    added[device] = added.get(device, 0.0) + cost.flops * count
                if cost.bytes_accessed is not None:
                    self.bytes[device] = self.bytes.get(device, 0.0) + cost.bytes_accessed * count
        for device, flops in added.items():
            self.hardware[device] = self.hardware.get(device, 0.0) + flops
        self.peak_memory.steps(book(list(counts.items()), self.collectives, self.waiting), booked)
        return added

    def devices(
        self,
        peaks: Mapping[tuple[str, int], tuple[float, str]],
        mfu: Mapping[tuple[str, int], float],
        hfu: Mapping[tuple[str, int], float],
        link_bandwidth: tuple[tuple[str, float], ...],
    ) -> tuple[DeviceTraining, ...]:
        """Each local device's totals now, with its peak (FLOP/s, source), MFU and HFU."""
        peak_memory = self.peak_memory.maxima()
        return tuple(
            DeviceTraining(
                platform=d.platform,
                id=d.id,
                model_flops_total=self.model.get(d.key),
                hardware_flops_total=self.hardware.get(d.key),
                hardware_bytes_total=self.bytes.get(d.key),
                peak_flops=peaks[d.key][0] if d.key in peaks else None,
                peak_source=peaks[d.key][1] if d.key in peaks else None,
                mfu=mfu.get(d.key),
                hfu=hfu.get(d.key),
                collective_bytes_total=dict(self.collectives.get(d.key, {})),
                program_peak_memory_bytes=peak_memory.get(d.key),
                link_bandwidth=per_link(d.device_kind, link_bandwidth),
            )
            for d in self._devices
        )


def read_slow(batch: list[Handoff], value: Callable[[Any], Any], problem: Callable[..., None]) -> dict[int, Read]:
    """The steps of `batch` whose number or figures are arrays, or not usable as given, read and checked
    (steps.read_figures), by id() of their hand-off; the rest need nothing (a check a figure)."""
    if batch:  # the common batch: host int numbers and the same usable figures at every step (C loops, no step's)
        _, numbers, examples, tokens, flops, _, _ = columns(batch)
        if set(map(type, numbers)) == INT and steady(examples) and steady(tokens) and steady(flops):
            return {}
    slow: dict[int, Read] = {}
    checked: tuple[Any, Any, Any] | None = None  # the last figures found usable (a loop passes the same ones)
    for item in batch:
        if type(item[1]) is int:
            if checked is not None and item[2] is checked[0] and item[3] is checked[1] and item[4] is checked[2]:
                continue
            if usable(item[2]) and usable(item[3]) and usable(item[4]):
                checked = (item[2], item[3], item[4])
                continue
        step = Step.of(item)
        try:
            number = read_figures(step, value, problem)
        except Exception as exc:  # a bug here: this step is not booked, and the waiter goes on
            problem("error", "the training waiter failed on a step", detail=f"{type(exc).__name__}: {exc}")
            number = None
        slow[id(item)] = (number, step.examples, step.tokens, step.model_flops)
    return slow


def read_loss(books: Books, hold: Hold | None, now: float, value: Callable[[Any], Any]) -> dict[str, float] | None:
    """The loss gauge's values from a looked-at step's scalars, once it is done (at most once per LOSS_EVERY
    seconds: a copy to the host each); None when not read."""
    if hold is None or not hold.loss or now - books.loss_read < LOSS_EVERY:
        return None
    books.loss_read = now
    try:
        return {name: float(value(h)) for name, h in zip(hold.loss, hold.handles, strict=False)}
    except Exception:  # deleted or donated since (counted with its step, unready): no reading this time
        return None
