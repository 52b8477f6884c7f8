"""jaxmon.checkpoints: a process's last checkpoint from the saves Orbax reports (started, then completed, in order)
and jaxmon.checkpointed(); its families; and how the embedded exporter tells how its process ends
(jaxmon.embedded). Orbax's own events through a real CheckpointManager are tests/e2e/test_churn.py's."""

from __future__ import annotations

import signal
from itertools import count

import pytest

from jaxmon import embedded
from jaxmon.checkpoints import MAX_PENDING, CheckpointReading, Checkpoints
from jaxmon.families.checkpoint import checkpoint_families
from jaxmon.lastword import EXCEPTION, NORMAL, SIGNAL


def clock() -> Checkpoints:
    ticks = count(100)
    return Checkpoints(clock=lambda: float(next(ticks)))


def test_a_save_is_a_checkpoint_once_it_completed_with_the_step_and_time_it_started_at() -> None:
    progress = clock()
    assert progress.reading() == CheckpointReading()
    progress.started(10)  # at 100
    assert progress.reading() == CheckpointReading()  # not durable yet: a crash now loses it
    progress.started(20)  # at 101 (an async save may start while the last one commits)
    progress.completed()
    assert progress.reading() == CheckpointReading(step=10, time=100.0)
    progress.completed()
    assert progress.reading(1800.0, 500) == CheckpointReading(20, 101.0, 1800.0, 500)
    progress.completed()  # a completion nothing started (a save before jaxmon listened): nothing to book
    assert progress.reading().step == 20


def test_a_save_before_any_step_keeps_the_last_step_known_and_the_calls_of_other_checkpointers_count() -> None:
    progress = clock()
    progress.started(None)  # at 100: no step handed yet (a save of the initial state)
    progress.completed()
    assert progress.reading() == CheckpointReading(step=None, time=100.0)
    progress.checkpointed(7)  # at 101
    assert progress.reading() == CheckpointReading(7, 101.0)
    progress.checkpointed(5, when=50.0)  # about an older save: the newer one stands
    assert progress.reading() == CheckpointReading(7, 101.0)


def test_saves_that_never_complete_are_bounded() -> None:
    progress = clock()
    for n in range(MAX_PENDING * 2):
        progress.started(n)
    progress.completed()
    assert progress.reading().step == MAX_PENDING  # the oldest dropped, the newest kept


def test_checkpointed_never_raises_into_the_loop() -> None:
    import jaxmon

    jaxmon.checkpointed("not a step")  # type: ignore[arg-type]  # a warning, no exception


def test_the_families_have_a_series_for_each_number_known() -> None:
    labels = {"workload": "w", "process_index": "0"}
    step, when, interval, steps = checkpoint_families([(labels, CheckpointReading(step=4, interval_seconds=60.0))])
    assert [s.value for s in step.samples] == [4.0] and when.samples == [] and steps.samples == []
    assert [(s.name, s.value) for s in interval.samples] == [("jaxmon_training_checkpoint_interval_seconds", 60.0)]


@pytest.mark.parametrize(
    ("uncaught", "ending"),
    [
        (None, (NORMAL, "")),
        (RuntimeError("boom"), (EXCEPTION, "")),
        (KeyboardInterrupt(), (SIGNAL, "SIGINT")),
    ],
)
def test_the_exit_says_how_the_script_ended(
    uncaught: BaseException | None, ending: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BaseException] = []
    monkeypatch.setattr(embedded, "_uncaught", None)
    monkeypatch.setattr(embedded, "_previous_excepthook", lambda kind, value, tb: seen.append(value))
    if uncaught is not None:
        embedded._excepthook(type(uncaught), uncaught, None)
        assert seen == [uncaught]  # the hook that was there still runs (the traceback is printed)
    assert embedded._ending() == ending


def test_the_sigterm_handler_is_only_installed_over_the_default() -> None:
    # This process (pytest) has the default at the C level unless a library set one: the check reads it as it is.
    assert embedded._c_default(signal.SIGTERM) is (signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    assert embedded._c_default(signal.SIGINT) is False  # Python's own KeyboardInterrupt handler is not the default
