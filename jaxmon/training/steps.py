"""The steps `step()` hands to jaxmon's waiter, and the checks a step number and a figure pass before they count.

On the training thread `step()` appends one `Handoff` (a plain tuple: the cheapest thing to make) to a deque; the
waiter takes the ones handed since it last looked. Most steps carry no handle at all: the waiter asks for one step
a look (docs/training.md, "How a step is measured"), and that step's `Hold` is jaxmon's own handles on its ready
arrays (`ops.hold`), which the waiter waits for: the steps before it completed before it (one device runs its
programs in dispatch order). A number or figure given as a JAX array travels as a `Held`: jaxmon's own handle on
it, read on jaxmon's thread once the step is done.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

# What step() is given besides the ready arrays, in the order of Step.given.
FIELDS = ("step", "examples", "tokens", "model_flops")
# Types of figures that are no array, checked first on the training thread (the common case costs no more).
PLAIN = frozenset({int, float, type(None)})
# The types of a batch's step numbers when each is a host int: no marker among them, no number to read (a C loop's
# `set(map(type, numbers))` tells).
INT = frozenset({int})

# One step as step() hands it: (handed, number, examples, tokens, model_flops, programs, hold). `handed` the
# tracker's clock at the call; the number and figures as given (an array as a Held); `programs` the tracked programs
# called since the previous step() (one entry a call); `hold` the handles the waiter waits on (None: this step is
# not looked at, the next looked-at step's completion bounds it). A `MARK` number is no step: its hold dates the
# steps handed before it (a badput() block opens, the loop paused).
Handoff = tuple[float, Any, Any, Any, Any, "tuple[Any, ...]", "Hold | None"]
MARK = object()
# A `RESUMED` number is no step either: step() hands it (no hold, at the call's time) before a step that came after
# the loop paused within a long look (no step() for the waiter's `resumed_after`): the steps before it completed
# before the pause, not when the host's next calls came.
RESUMED = object()
# The programs of a step that ran no tracked call (shared: never appended to).
NO_CALLS: tuple[()] = ()
# A step that follows on is handed as its hand-off time alone (a float: no object the cyclic GC tracks, so a look of
# thousands of steps makes it collect no more than the loop does): its number is the step before's + 1, its figures
# and tracked calls the step before's (step() hands it only then), no hold. The deque holds Handoff tuples and these;
# `expand` makes the tuples of a batch where the waiter needs them, `Run.of` its columns where it does not.
Item = Handoff | float
# The step before a batch, whose number, figures and calls a follow-on step takes on: (number, examples, tokens,
# model_flops, programs); None before the first step.
Base = tuple[int, Any, Any, Any, tuple[Any, ...]]


# A Handoff's fields (C loops over a batch: a look of hundreds of steps pays no Python step a step).
HANDED, NUMBER, HOLD = itemgetter(0), itemgetter(1), itemgetter(6)


def columns(batch: list[Handoff]) -> tuple[tuple[Any, ...], ...]:
    """A batch's hand-offs as its seven columns (C loops: no object a step, where `zip(*batch)` makes an iterator a
    step, as many objects for the cyclic GC to count)."""
    return tuple(tuple(map(itemgetter(k), batch)) for k in range(7))


def at(item: Any) -> float:
    """When a handed item (a Handoff or a follow-on step's float) was handed."""
    return item if type(item) is not tuple else item[0]  # type: ignore[no-any-return]


def held(item: Any) -> bool:
    """Whether a handed item carries a hold (only a Handoff can)."""
    return type(item) is tuple and item[6] is not None


def expand(items: list[Any], base: Base | None) -> tuple[list[Handoff], Base | None]:
    """`items` as Handoff tuples (a follow-on step's from the step before it, `base` the one before them), and the
    base of the items that come after them."""
    out: list[Handoff] = []
    for item in items:
        if type(item) is tuple:
            out.append(item)
            if type(item[1]) is int:
                base = (item[1], item[2], item[3], item[4], item[5])
        elif base is not None:
            base = (base[0] + 1, base[1], base[2], base[3], base[4])
            out.append((item, base[0], base[1], base[2], base[3], base[4], None))
    return out, base


@dataclass(slots=True)
class Run:
    """A batch of steps numbered on from the step before it, each with the same figures and tracked calls, as
    columns (the waiter's common batch: no tuple a step): their hand-off times, the first number, the figures, the
    calls, and the holds among them."""

    handed: list[float]
    first: int
    examples: Any
    tokens: Any
    model_flops: Any
    programs: tuple[Any, ...]
    holds: list[Hold]

    @property
    def numbers(self) -> range:
        """The steps' numbers."""
        return range(self.first, self.first + len(self.handed))

    def last(self) -> Base:
        """The run's last step, as the base of the steps after it."""
        return (self.first + len(self.handed) - 1, self.examples, self.tokens, self.model_flops, self.programs)

    def handoffs(self) -> list[Handoff]:
        """The steps as Handoff tuples (no holds: booking reads none), for a booking step by step."""
        ex, tok, mf, programs = self.examples, self.tokens, self.model_flops, self.programs
        return [(h, n, ex, tok, mf, programs, None) for h, n in zip(self.handed, self.numbers, strict=True)]

    @classmethod
    def of(cls, items: list[Any], base: Base | None) -> Run | None:
        """`items` (a batch as handed, none a marker) as a Run, when each is a follow-on step or a Handoff that could
        have been one (its number the next, its figures equal host numbers, its calls the same); else None. C loops
        over the batch, a Python step per Handoff only."""
        if base is None or not items:
            return None
        types = list(map(type, items))
        handed = list(items)
        holds: list[Hold] = []
        number, examples, tokens, flops, programs = base
        plain = PLAIN
        if type(examples) not in plain or type(tokens) not in plain or type(flops) not in plain:
            return None
        i = -1
        for _ in range(types.count(tuple)):
            i = types.index(tuple, i + 1)
            item = items[i]
            if not (
                type(item[1]) is int
                and item[1] == number + 1 + i
                and item[5] == programs  # (programs compare by identity)
                and type(item[2]) is type(examples) and item[2] == examples
                and type(item[3]) is type(tokens) and item[3] == tokens
                and type(item[4]) is type(flops) and item[4] == flops
            ):  # fmt: skip
                return None
            handed[i] = item[0]
            if item[6] is not None:
                holds.append(item[6])
        return cls(handed, number + 1, examples, tokens, flops, programs, holds)


@dataclass(frozen=True, slots=True)
class Hold:
    """What the waiter waits on for a looked-at step: jaxmon's own handles on its ready arrays (or a barrier's
    outputs, when it gave none); `lost`: a ready array was deleted or donated before step() could hold it; `loss`:
    the names of the first `len(loss)` handles when the step's ready was a scalar or a dict of scalars (the loss
    gauge reads them once the step is done)."""

    handles: list[Any]
    lost: bool = False
    loss: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Held:
    """A number given to step() as a JAX array: jaxmon's own handle on it (None: deleted or donated already)."""

    handle: Any


@dataclass(slots=True)
class Step:
    """A handed step on the waiter's side: once read and checked, its number and figures (None: not given or
    dropped), and the completion the waiter books it at."""

    handed: float
    given: tuple[Any, Any, Any, Any]
    arrays: list[Any]
    programs: list[Any]
    lost: bool = False
    number: int = 0
    examples: float | None = None
    tokens: float | None = None
    model_flops: float | None = None

    @classmethod
    def of(cls, handoff: Handoff) -> Step:
        """The slow path's view of a handed step (a figure given as an array, or one that is not a usable number)."""
        handed, number, examples, tokens, model_flops, programs, hold = handoff
        arrays, lost = (hold.handles, hold.lost) if hold is not None else ([], False)
        return cls(handed, (number, examples, tokens, model_flops), arrays, list(programs), lost)

    def figure_handles(self) -> list[Any]:
        """The handles of the numbers given as arrays (not deleted before step())."""
        return [g.handle for g in self.given if type(g) is Held and g.handle is not None]

    def drop_arrays(self) -> None:
        """Hold no array longer than needed (once waited for and read)."""
        self.arrays, self.given = [], (None, None, None, None)


def loss_names(ready: tuple[Any, ...], arrays: list[Any]) -> tuple[str, ...]:
    """The loss gauge's names for `ready`'s arrays (`ops.arrays(ready)`, in its leaves' order): `loss` for one
    scalar, a dict's keys for a dict of scalars (flattened in key order, as JAX flattens a dict); none for anything
    else (the loss gauge is left out)."""
    if len(ready) != 1 or not all(getattr(a, "shape", None) == () for a in arrays):
        return ()
    tree = ready[0]
    if len(arrays) == 1 and tree is arrays[0]:
        return ("loss",)
    if type(tree) is dict and len(tree) == len(arrays) and all(type(k) is str for k in tree):
        keys = sorted(tree)
        if all(tree[k] is a for k, a in zip(keys, arrays, strict=True)):
            return tuple(keys)
    return ()


def read_figures(step: Step, read: Callable[[Any], Any], problem: Callable[..., None]) -> int | None:
    """Read and check the step's number and figures into `step`; the number, None when it is not a usable one.
    A figure that is not a finite number >= 0, or a number that is not an integer, is dropped for this step
    and counted as `invalid`, logged once per field with what was given; an array deleted before it could be
    read is dropped and counted as `unread`."""
    given = step.given
    if type(given[0]) is int:
        try:  # the common case: host numbers, all usable (nothing to count); else the checks below say what is wrong
            plain = [None if g is None else float(g) if type(g) is float or type(g) is int else -1.0 for g in given[1:]]
        except OverflowError:
            plain = [-1.0]
        if all(g is None or (g >= 0 and math.isfinite(g)) for g in plain):
            step.examples, step.tokens, step.model_flops = plain
            return given[0]
    values: list[Any] = []
    for name, value in zip(FIELDS, given, strict=True):
        if type(value) is Held:
            try:
                if value.handle is None:
                    raise ValueError("deleted or donated before step() was called")
                value = read(value.handle)
            except Exception as exc:
                problem("unread", "an array given to step() was deleted or donated before it was read",
                        key=f"unread.{name}", field=name, detail=str(exc)[:200])  # fmt: skip
                values.append(None)
                continue
        checked = integer(value) if name == "step" else figure(value)
        if checked is None and (value is not None or name == "step"):
            problem("invalid", "a number given to step() is not usable: dropped for this step",
                    key=f"invalid.{name}", field=name, given=shown(value),
                    expected="an integer" if name == "step" else "a finite number >= 0")  # fmt: skip
        values.append(checked)
    step.examples, step.tokens, step.model_flops = values[1:]
    number: int | None = values[0]
    return number


def figure(value: Any) -> float | None:
    """`value` as a finite float >= 0: a Python, NumPy (or read JAX) real scalar; None for anything else."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or scalar(value, "iuf")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def integer(value: Any) -> int | None:
    """`value` as a step number: a Python, NumPy (or read JAX) integer; a float, even 3.0, or a bool is not one."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Integral) or scalar(value, "iu")):
        return None
    return int(value)


def scalar(value: Any, kinds: str) -> bool:
    """Whether `value` is a NumPy scalar or 0-d array of one of the dtype `kinds` (as a JAX scalar reads)."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return getattr(value, "shape", None) == () and isinstance(kind, str) and len(kind) == 1 and kind in kinds


def shown(value: Any) -> str:
    """What was given, for a log line: a host value's repr (cut short), an array's type only (its repr would wait
    for the device)."""
    if isinstance(value, str | numbers.Number) or value is None:
        return repr(value)[:80]
    shape = getattr(value, "shape", None)
    if shape is not None and not hasattr(value, "block_until_ready"):
        try:
            return repr(value)[:80]
        except Exception:
            pass
    return f"{type(value).__name__} of shape {shape}" if shape is not None else type(value).__name__
