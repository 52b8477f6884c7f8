"""jaxmon.step() against a loop that deletes, donates and reuses what it hands over (issue 33), in real child
processes under faulthandler on 8 CPU devices: the child never crashes, and every step is accounted for in its
own exposition. And the training thread never waits for a device scalar it passes as a figure.

Before issue 33 the waiter called `is_ready()` on the user's arrays: the first array deleted before the waiter
reached it killed the child with SIGSEGV (exit -11, faulthandler's "Segmentation fault" on stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, sample
from tests.helpers import free_port, jaxmon_env, parse_samples

STRESS = ROOT / "tests" / "workloads" / "step_stress.py"
STEPS = 3000


def run(tmp_path: Path, script: Path, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Run a workload child to its end; its `OK <json>` answer. A crash fails with its exit status and stderr
    (faulthandler's stacks of every thread)."""
    stderr = tmp_path / f"{script.stem}.stderr"
    with open(stderr, "w") as err:
        proc = subprocess.run(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=jaxmon_env({"JAXMON_LOG_LEVEL": "error"}),
            cwd=ROOT,
            timeout=timeout,
        )
    log = stderr.read_text(errors="replace")
    assert proc.returncode == 0, f"the child exited {proc.returncode}:\n{log[-6000:]}"
    assert "Fatal Python error" not in log, log[-6000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OK ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    return dict(json.loads(lines[0][3:]))


@pytest.mark.parametrize("seed", [1, 2])
def test_a_loop_that_deletes_donates_and_reuses_what_it_hands_step_never_crashes(tmp_path: Path, seed: int) -> None:
    answer = run(tmp_path, STRESS, str(free_port()), str(STEPS), str(seed))
    s = parse_samples(answer["exposition"])
    # The process's labels (workload, host, process_index, process_count), as its steps_total carries them.
    labels = next(dict(k[1]) for k in s if k[0] == "jaxmon_training_steps_total")
    assert labels["workload"] == "stress"

    def problems(reason: str) -> float:
        return sample(s, "jaxmon_training_tracking_problems_total", **labels, reason=reason) or 0.0

    assert answer["handed"] == STEPS
    booked = sample(s, "jaxmon_training_steps_total", **labels)
    # Every step handed is booked, but those whose step number the loop deleted before step() (no number to book
    # them under: counted as unread) and any dropped from a full queue (counted).
    assert booked == STEPS - answer["unbooked"] - problems("dropped")
    assert problems("unread") >= answer["unbooked"]
    # Unready: every step whose ready array was deleted before step(), at most every step whose ready arrays the
    # loop deleted or donated at all; the others were seen complete.
    assert answer["lost_before"] <= problems("unready") <= answer["at_risk"]
    assert problems("invalid") == answer["invalid"]
    assert problems("error") == 0
    # Tokens: a whole number of steps' worth (the device scalar, read once computed), at least every step whose
    # scalar the loop kept, at most every booked one; never NaN or negative.
    tokens = sample(s, "jaxmon_training_tokens_total", **labels)
    assert tokens is not None and tokens % answer["tokens_per_step"] == 0
    assert answer["tokens_kept"] <= tokens / answer["tokens_per_step"] <= STEPS
    examples = sample(s, "jaxmon_training_examples_total", **labels)
    assert examples is not None and examples % 4 == 0 and examples <= 4 * STEPS
    completed = sample(s, "jaxmon_training_step_duration_seconds_count", **labels)
    assert completed is not None and booked is not None and 0 < completed < booked
