"""Checkpoints with the real Orbax: a training loop under jaxmon.start() saves synchronously (ocp.Checkpointer) and
asynchronously (ocp.CheckpointManager) and restores, with no badput() of its own. Orbax's jax.monitoring events
are the only way the time reaches jaxmon: checkpoint and restore badput are the time those events say the calls
blocked (the loop's own listener sums them), which lies inside what the loop measured around its calls (most of it:
a CheckpointManager's save does some work before its blocking part, more of it on a loaded machine)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, promtool, sample
from tests.helpers import Child, wait_for_samples

SCRIPT = ROOT / "tests" / "workloads" / "checkpoint.py"


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path, str(tmp_path / "ckpt"), script=SCRIPT)
    yield c
    c.close()


def test_orbax_saves_and_restores_are_checkpoint_and_restore_badput(child: Child) -> None:
    url = child.hello["url"]
    ran = child.send("run")
    steps = ran["steps"]
    labels = {"workload": "ckpt", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    s = wait_for_samples(url, lambda s: sample(s, "jaxmon_training_steps_total", **labels) == steps, "every step")
    checkpoint = sample(s, "jaxmon_training_badput_seconds_total", **labels, kind="checkpoint")
    restore = sample(s, "jaxmon_training_badput_seconds_total", **labels, kind="restore")
    measured = (
        f"loop: saves {ran['saved']:.3f} s, restores {ran['restored']:.3f} s; Orbax's events: {ran['orbax_saved']:.3f}"
        f" s, {ran['orbax_restored']:.3f} s; exported {checkpoint}, {restore}"
    )
    assert checkpoint == pytest.approx(ran["orbax_saved"], rel=0.02), measured
    assert restore == pytest.approx(ran["orbax_restored"], rel=0.02), measured
    for kind in ("saved", "restored"):
        assert 0.5 * ran[kind] < ran[f"orbax_{kind}"] <= ran[kind], measured
    check = subprocess.run(
        [promtool(), "check", "metrics"], input=requests.get(url + "/metrics", timeout=10).text, capture_output=True,
        text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert child.send("exit") == {"stopped": True}
