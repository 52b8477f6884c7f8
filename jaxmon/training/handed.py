"""The tracker's port: its view of JAX (`TrainingOps`), its options (`TrackerConfig`), a tracked program, and the
jax.monitoring events that are time not training."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jaxmon.device_readings import DeviceInfo

# jax.monitoring events that are time not training: XLA compilations (a time span: jax's dispatch records each as
# its start and end), and Orbax's blocking checkpoint saves and its restores (durations, recorded as they end:
# orbax-checkpoint 0.12's async save records the first name, a synchronous one the second; a restore one of the
# read names, by whether it ran asynchronously).
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
    def ready(self, handles: list[Any]) -> bool: ...
    def deleted(self, handle: Any) -> bool: ...
    def value(self, handle: Any) -> Any: ...
    def signature(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Hashable: ...
    def avals(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any: ...
    def compiled(self, fn: Any, avals: Any) -> Any: ...
    def communication(self, program: Any) -> Any: ...
    def cache_size(self, fn: Any) -> int | None: ...
    def on_event_duration(self, callback: Callable[[str, float], None]) -> Callable[[], None]: ...
    def on_event_span(self, callback: Callable[[str, float, float], None]) -> Callable[[], None]: ...
    def on_event(self, callback: Callable[[str], None]) -> Callable[[], None]: ...
    def profiler(self) -> Profiler: ...


@dataclass(frozen=True)
class SamplerConfig:
    """Sampled traces: every `every` steps (0: off, traces on demand only), a trace of `steps` whole steps, at most
    one per `min_seconds` of Unix time (0: every block)."""

    every: int
    steps: int
    min_seconds: float = 0.0


class Profiler(Protocol):
    """What the sampler needs of JAX's profiler (jaxmon.sources.local.profiler.JaxProfiler)."""

    def start(self, python: bool) -> None: ...  # raises sampler.Busy
    def stop(self) -> bytes: ...  # the serialized XSpace; raises Busy when the user's trace ended jaxmon's
    def export(self, directory: Path) -> None: ...  # stop, writing plugins/profile/<run>/<host>.xplane.pb there
    def devices(self) -> Mapping[tuple[str, int], tuple[str, int]]: ...  # trace (platform, ordinal) -> device key


@dataclass(frozen=True)
class TrackerConfig:
    """The training collector's options, as the tracker uses them."""

    peak_flops: float | None = None  # per device; overrides the table
    window: int = 100
    stall_factor: float = 3.0
    max_pending: int = 8192
    profile: SamplerConfig = field(default_factory=lambda: SamplerConfig(0, 2))  # sampled traces (sampler.py)
    link_bandwidth: tuple[tuple[str, float], ...] = ()  # (link, bytes/s per direction): overrides the table


@dataclass(eq=False)  # hashed by identity: the waiter counts a batch's calls per program
class Program:
    """One compiled program of a tracked function and its cost, read on the calling thread at its first call (in
    the loop's own contexts: `with mesh:`, `use_mesh`, Flax's axis rules); None when it could not be read. Its
    `communication` (jaxmon.training.communication) is set later by jaxmon's analysis thread: None until then."""

    fn: Any
    cost: Any = None
    communication: Any = None
    # The calls of a step that ran this program once (step() hands this one tuple, no list a step).
    once: tuple[Program, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.once = (self,)
