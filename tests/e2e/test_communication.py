"""Communication per program, from the compiled HLO, in a real training process (issue 34): the collective bytes per
step jaxmon.start() exports equal what the loop's shapes give by nccl-tests' convention, per device and mesh axis,
and the predicted peak equals the program's own memory analysis. One child runs the phases of
tests/workloads/communication.py in turn; each phase's bytes are the counters' increase over its steps."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import requests

from tests.conftest import ROOT, Samples, StartDaemon, promtool, sample
from tests.e2e.test_training import TRAINING_FAMILIES, training_series_budget
from tests.helpers import Child, wait_for_fresh_samples, wait_for_samples

WORKLOAD = ROOT / "tests" / "workloads" / "communication.py"
# The workload's shapes (tests/workloads/communication.py).
D, B, L = 512, 64, 6
F32 = 4
STEPS = 6  # more than the workload's window of 5: the peak gauge then holds the phase's program only
DEVICES = [str(d) for d in range(8)]
COLLECTIVES = "jaxmon_training_collective_bytes_total"


def collective_bytes(s: Samples) -> dict[tuple[str, str, str, str], float]:
    """(device, op, axes, link) -> bytes of the comm workload's series."""
    return {
        (labels["device"], labels["op"], labels["axes"], labels["link"]): value
        for (name, key), value in s.items()
        if name == COLLECTIVES and (labels := dict(key))["workload"] == "comm"
    }


def test_collective_bytes_per_step_and_axis_and_the_predicted_peak_are_what_the_shapes_give(
    children: list[Child], tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    child = Child(tmp_path, "--spool", str(spool), script=WORKLOAD, env={"JAXMON_COLLECTOR__PROBE": "false"})
    children.append(child)
    url = child.hello["url"]
    process = {"workload": "comm", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    # Per device and step, by nccl-tests' convention: an all-reduce moves its buffer.
    expected = {
        # the gradient of the replicated w (D x D), all-reduced over the 4 "data" devices
        "allreduce": {("all-reduce", "data", "local"): D * D * F32},
        # the same step with the batch replicated: nothing to reduce
        "local": {},
        # L layers, each a psum over "data" of the (B/4 x D) block of a device
        "scan": {("all-reduce", "data", "local"): L * (B // 4) * D * F32},
        # a psum over "model" of each device's (B x D/2) block
        "psum_model": {("all-reduce", "model", "local"): B * (D // 2) * F32},
    }

    def seen(n: int) -> Samples:
        return wait_for_samples(url, lambda s: sample(s, "jaxmon_training_steps_total", **process) == n, f"{n} steps")

    before: dict[tuple[str, str, str, str], float] = {}
    for phase, per_step in expected.items():
        warm = child.send(f"phase {phase}")  # compiled, tracked, analysed; its first step handed
        steps = warm["steps"]

        seen(steps)  # a new (op, axes) series reads 0 until a scrape has served it (born at zero): this one
        before = collective_bytes(wait_for_fresh_samples(url, "training", "after that scrape"))
        assert child.send(f"run {STEPS}")["steps"] == steps + STEPS
        seen(steps + STEPS)  # the same for a series first seen since (a program analysed during the run)
        after_samples = wait_for_fresh_samples(url, "training", "after that scrape")
        after = collective_bytes(after_samples)
        added = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
        # Every call counts: the phase's first, made before jaxmon analysed its program, too.
        want = {(d, *key): float((STEPS + 1) * n) for d in DEVICES for key, n in per_step.items()}
        assert added == want, (phase, added, want)
        # The largest predicted peak of the programs the window's steps called: this phase's, as the loop computed.
        for d in DEVICES:
            peak = sample(
                after_samples, "jaxmon_training_program_peak_memory_bytes", device=d, platform="cpu", **process
            )
            assert peak == warm["peak"], (phase, d, peak, warm["peak"])
        before = after
    # Two (op, axes, link) series on each of the 8 devices: all-reduce over data, all-reduce over model (one
    # process of CPU devices: every group is local).
    pairs = {(op, axes, link) for _, op, axes, link in collective_bytes(after_samples)}
    assert pairs == {("all-reduce", "data", "local"), ("all-reduce", "model", "local")}
    series = [k for k in after_samples if k[0].startswith(TRAINING_FAMILIES) and ("workload", "comm") in k[1]]
    assert len(series) <= training_series_budget(8, collective_pairs=2), sorted(k[0] for k in series)
    # The sidecar reads the same figures from the spool (schema 3).
    peak_series = "jaxmon_training_program_peak_memory_bytes"
    sidecar = start_daemon("--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.2s")
    embedded_peaks = {dev: sample(after_samples, peak_series, device=dev, platform="cpu", **process) for dev in DEVICES}
    sidecar.wait_for(
        lambda s: (
            collective_bytes(s) == after
            and {dev: sample(s, peak_series, device=dev, platform="cpu", **process) for dev in DEVICES}
            == embedded_peaks
        ),
        what="the sidecar's collective bytes and peaks equal the embedded exporter's",
    )
    text = requests.get(url + "/metrics", timeout=10).text
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert child.proc.stdin is not None
    child.proc.stdin.write("exit\n")
    child.proc.stdin.close()
    assert child.proc.wait(30) == 0, child.log()
