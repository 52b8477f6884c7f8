"""What `step()` is handed and how the waiter reads it: the tracker's view of JAX (`TrainingOps`), its options, a
queued step, and the checks a step number and a figure pass before they count (a finite number >= 0; an integer)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jaxmon.device_readings import DeviceInfo

# jax.monitoring duration events that are time not training: XLA compilations, and Orbax's blocking checkpoint
# saves and its restores (orbax-checkpoint 0.12: an async save records the first name, a synchronous one the second;
# a restore records one of the read names, by whether it ran asynchronously).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CHECKPOINT_EVENTS = (
    "/jax/checkpoint/write/async/blocking_duration_secs",
    "/jax/orbax/write/total_duration_secs",
)
RESTORE_EVENTS = (
    "/jax/orbax/read/total_duration_secs",
    "/jax/orbax/read/async/blocking_duration_secs",
)
EVENT_KIND = (
    {COMPILE_EVENT: "compile"}
    | dict.fromkeys(CHECKPOINT_EVENTS, "checkpoint")
    | dict.fromkeys(RESTORE_EVENTS, "restore")
)
# The kinds of badput intervals a process exports: compile and checkpoint (from jax.monitoring) always, and this
# many kinds of badput() blocks; time of a further kind counts as OTHER_KIND, so a kind made of data
# (badput(f"eval-{n}")) cannot grow the series without bound. With other, startup, stall, restart and host a
# process has at most 18 badput series.
EVENT_KINDS = frozenset({"compile", "checkpoint", "restore"})
MAX_USER_KINDS = 10
OTHER_KIND = "other"


class TrainingOps(Protocol):
    """What the tracker needs of JAX (jaxmon.sources.local.training.JaxTraining)."""

    def devices(self) -> list[DeviceInfo]: ...
    def device_count(self) -> int: ...
    def process_count(self) -> int: ...
    def arrays(self, tree: Any) -> list[Any]: ...
    def is_array(self, value: Any) -> bool: ...
    def hold(self, array: Any) -> Any | None: ...
    def barrier(self) -> list[Any]: ...
    def wait(self, handles: list[Any]) -> None: ...
    def deleted(self, handle: Any) -> bool: ...
    def value(self, handle: Any) -> Any: ...
    def signature(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Hashable: ...
    def avals(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any: ...
    def cost(self, fn: Any, avals: Any) -> Any: ...
    def compiled(self, fn: Any, avals: Any) -> Any: ...
    def communication(self, program: Any) -> Any: ...
    def cache_size(self, fn: Any) -> int | None: ...
    def on_event_duration(self, callback: Callable[[str, float], None]) -> Callable[[], None]: ...


@dataclass(frozen=True)
class TrackerConfig:
    """The training collector's options, as the tracker uses them."""

    peak_flops: float | None = None  # per device; overrides the table
    window: int = 100
    stall_factor: float = 3.0
    max_pending: int = 1024
    profile: tuple[int, int] = (0, 2)  # sampled traces: every this many steps (0: off), this many steps (sampler.py)
    link_bandwidth: tuple[tuple[str, float], ...] = ()  # (link, bytes/s per direction): overrides the table


@dataclass
class Program:
    """One compiled program of a tracked function and its cost, read on the calling thread at its first call (in
    the loop's own contexts: `with mesh:`, `use_mesh`, Flax's axis rules); None when it could not be read. Its
    `communication` (jaxmon.training.communication) is set later by jaxmon's analysis thread: None until then."""

    fn: Any
    cost: Any = None
    communication: Any = None


# What step() is given besides the ready arrays, in the order of _Pending.given.
FIELDS = ("step", "examples", "tokens", "model_flops")
# Types of figures that are no array, checked first on the training thread (the common case costs no more).
_PLAIN = frozenset({int, float, type(None)})


@dataclass(frozen=True)
class _Held:
    """A number given to step() as a JAX array: jaxmon's own handle on it (None: deleted or donated already)."""

    handle: Any


@dataclass(slots=True)
class _Pending:
    """A step handed to step(): its ready arrays and numbers as given (JAX arrays as jaxmon's own handles); once
    the waiter has read and checked them, its number and figures (None: not given or dropped)."""

    given: tuple[Any, Any, Any, Any]  # FIELDS
    arrays: list[Any]  # handles of the ready arrays, or of the barrier's outputs
    handed: float
    programs: dict[int, tuple[Program, int]] = field(default_factory=dict)
    lost: bool = False  # a ready array was deleted or donated before step() was called
    number: int = 0
    examples: float | None = None
    tokens: float | None = None
    model_flops: float | None = None


def read_figures(item: _Pending, read: Callable[[Any], Any], problem: Callable[..., None]) -> int | None:
    """Read and check the step's number and figures into `item`; the number, None when it is not a usable one.
    A figure that is not a finite number >= 0, or a number that is not an integer, is dropped for this step
    and counted as `invalid`, logged once per field with what was given; an array deleted before it could be
    read is dropped and counted as `unread`."""
    values: list[Any] = []
    for name, given in zip(FIELDS, item.given, strict=True):
        if isinstance(given, _Held):
            try:
                if given.handle is None:
                    raise ValueError("deleted or donated before step() was called")
                given = read(given.handle)
            except Exception as exc:
                problem("unread", "an array given to step() was deleted or donated before it was read",
                              key=f"unread.{name}", field=name, detail=str(exc)[:200])  # fmt: skip
                values.append(None)
                continue
        value = integer(given) if name == "step" else figure(given)
        if value is None and (given is not None or name == "step"):
            problem("invalid", "a number given to step() is not usable: dropped for this step",
                          key=f"invalid.{name}", field=name, given=shown(given),
                          expected="an integer" if name == "step" else "a finite number >= 0")  # fmt: skip
        values.append(value)
    item.examples, item.tokens, item.model_flops = values[1:]
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
