"""jaxmon.keras under a real Keras 3 `model.fit()` on the JAX backend, in a child process served by jaxmon.start()
and scraped over HTTP: every step reported with the step times Keras's own callbacks see, and Keras's async dispatch
kept (the host runs as far ahead of the device with the callback as without it)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import sample
from tests.helpers import Child, wait_for_samples

KERAS_FIT = Path(__file__).resolve().parents[1] / "workloads" / "keras_fit.py"
EPOCHS, STEPS = 2, 15


def test_keras_fit_reports_every_step_at_kerass_own_step_times_without_a_sync(
    children: list[Child], tmp_path: Path
) -> None:
    child = Child(tmp_path, "--workload", "keras", script=KERAS_FIT, env={"KERAS_BACKEND": "jax"})
    children.append(child)
    assert child.hello["backend"] == "jax"
    url = child.hello["url"]
    child.send("fit 1 4 0")  # compiles the step: the fits below all run compiled, 4 optimizer steps done
    plain = child.send(f"fit {EPOCHS} {STEPS} 0")
    fitted = child.send(f"fit {EPOCHS} {STEPS} 1")
    n = EPOCHS * STEPS
    labels = {"workload": "keras", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    steps = "jaxmon_training_steps_total"
    s = wait_for_samples(url, lambda s: sample(s, steps, **labels) == n, "every step of the fit")

    # Every batch is a step, numbered as the optimizer counts them (4 + 30 before this fit), and its examples.
    assert len(fitted["done"]) == n
    assert sample(s, "jaxmon_training_step", **labels) == 4 + n + n - 1
    assert sample(s, "jaxmon_training_examples_total", **labels) == n * fitted["batch"]
    problems = [k for k in s if k[0] == "jaxmon_training_tracking_problems_total" and s[k] > 0]
    assert problems == []
    # Completion to completion, as Keras's own on_train_batch_end saw the batches' logs computed (on its executor
    # threads, a thread switch or two late each).
    assert sample(s, "jaxmon_training_step_duration_seconds_count", **labels) == n - 1
    total = sample(s, "jaxmon_training_step_duration_seconds_sum", **labels)
    keras_total = fitted["done"][-1] - fitted["done"][0]
    assert total == pytest.approx(keras_total, rel=0.1, abs=0.02)

    # No sync added: at some batch the training thread had handed the step many batches the device had not yet
    # computed, as without the callback (each step is tens of milliseconds of device time, its dispatch far less).
    assert plain["ahead"] >= 5, plain
    assert fitted["ahead"] >= max(5, plain["ahead"] // 2), (fitted["ahead"], plain["ahead"])

    # A second fit numbers on from the optimizer: no step number goes back or jumps.
    child.send(f"fit 1 {STEPS} 1")
    s = wait_for_samples(url, lambda s: sample(s, steps, **labels) == n + STEPS, "the second fit's steps")
    assert sample(s, "jaxmon_training_step", **labels) == 4 + n + n + STEPS - 1
    assert [k for k in s if k[0] == "jaxmon_training_tracking_problems_total" and s[k] > 0] == []


def test_import_jaxmon_and_its_training_names_load_no_keras() -> None:
    """Keras loads with `import jaxmon.keras` only: a trainer without Keras, and the daemon, never import it."""
    code = (
        "import sys, jaxmon; jaxmon.step; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'keras' or m == 'jaxmon.keras'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
