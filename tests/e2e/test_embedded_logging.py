"""What jaxmon.start() prints inside a trainer that logs at INFO (`logging.basicConfig(level=logging.INFO)`, as
many do): no apscheduler line per job run (the daemon's configure_logging quiets them; the embedded exporter must
too), while the trainer's own INFO lines, and jaxmon's, come out as the trainer's logging says."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

TRAINER = textwrap.dedent(
    """
    import logging, time
    logging.basicConfig(level=logging.INFO)
    import jaxmon

    exporter = jaxmon.start(0, workload="chatty", poll={"interval": 0.1}, collector={"probe": False})
    seen, deadline = set(), time.monotonic() + 60
    while len(seen) < 6 and time.monotonic() < deadline:  # six polls of the memory collector, each a job run
        status = exporter.runtime.snapshot().statuses.get("memory")
        if status is not None:
            seen.add(status.last_success_timestamp)
        time.sleep(0.02)
    logging.getLogger("trainer").info("step 10 loss 0.5")
    exporter.stop()
    print("polls", len(seen))
    """
)


def test_a_trainer_logging_at_info_gets_no_scheduler_lines_and_keeps_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", TRAINER],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAX_NUM_CPU_DEVICES": "8"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["polls", "6"], done.stderr
    lines = done.stderr.splitlines()
    assert "INFO:trainer:step 10 loss 0.5" in lines  # the trainer's own logger, untouched
    assert not [line for line in lines if "apscheduler" in line], done.stderr
    assert any(line.startswith("INFO:jaxmon.") for line in lines), done.stderr  # jaxmon's own, as they were
