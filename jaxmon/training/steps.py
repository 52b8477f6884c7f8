"""The steps `step()` hands to jaxmon's waiter, and the checks a step number and a figure pass before they count.

On the training thread `step()` appends one `Handoff` (a plain tuple: the cheapest thing to make) to a deque; the
waiter takes every one handed since it last looked and makes each a `Step`. A number or figure given as a JAX
array travels as a `Held`: jaxmon's own handle on it, read on jaxmon's thread once the step is done.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# What step() is given besides the ready arrays, in the order of Step.given.
FIELDS = ("step", "examples", "tokens", "model_flops")
# Types of figures that are no array, checked first on the training thread (the common case costs no more).
PLAIN = frozenset({int, float, type(None)})

# One step as step() hands it: (handed, given, handles, programs, lost). `handed` the tracker's clock at the call;
# `given` the FIELDS as given (an array as a Held); `handles` jaxmon's handles on the ready arrays (or a barrier's
# outputs); `programs` the tracked programs called since the previous step() (one entry a call); `lost` whether a
# ready array was deleted or donated before step() could hold it.
Handoff = tuple[float, tuple[Any, Any, Any, Any], list[Any], list[Any], bool]


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
        handed, given, arrays, programs, lost = handoff
        return cls(handed, given, arrays, programs, lost)

    def figure_handles(self) -> list[Any]:
        """The handles of the numbers given as arrays (not deleted before step())."""
        return [g.handle for g in self.given if type(g) is Held and g.handle is not None]

    def drop_arrays(self) -> None:
        """Hold no array longer than needed (once waited for and read)."""
        self.arrays, self.given = [], (None, None, None, None)


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
