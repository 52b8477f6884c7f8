"""docs/training-loops.md's Flax NNX + Optax loop and its MaxText-style loop, run as written
(tests/workloads/flax_loop.py and maxtext_loop.py, whose marked regions the doc shows:
tests/unit/test_docs_snippets.py) in real child processes on 8 CPU devices under jaxmon.start() at its defaults
(the probe on), scraped over HTTP: every step counted, the tokens and model FLOPs as each process's share of the
job's, XLA's FLOPs of the MaxText-style step as its cost analysis reads them in the loop's own mesh context (where
the step lowers at all), and no tracking problem; each loop run twice, exiting 0, with no probe timeout and no
probe run while it steps (docs/probe.md), its first run the one whose figures are checked; and the PromQL the
training pages show parses."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.helpers import Child, Samples, free_port, per_device, promtool, sample, scrape, wait_for_samples

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "tests" / "workloads"
ENV = {"JAXMON_COLLECTOR__TRAINING__PEAK_FLOPS": "1e11"}  # CPU has no peak in the table: MFU and HFU need one
# The probe's interval, short so that the loop spans several of them (the default is 15 s), yet well above a step's
# time on a loaded machine (the probe may run between steps further apart than its interval): the Flax loop's 500
# steps of a few ms take about 1.5 s, so its probe runs every 0.25 s with shots 10 ms apart (a run of about 40 ms);
# the MaxText-style loop's 50 steps take about 3 s, and its probe runs every 0.5 s at the default spacing.
PROBE = {"flax_loop.py": (0.25, "10ms"), "maxtext_loop.py": (0.5, "100ms")}


def labels(workload: str) -> dict[str, str]:
    return {"workload": workload, "process_index": "0", "process_count": "1", "host": socket.gethostname()}


def problems(s: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "jaxmon_training_tracking_problems_total" and v}


def probe_counts(s: Samples, name: str) -> float:
    """A jaxmon_probe_* counter of the one probed CPU device (cpu:0 stands for all of them), 0 when absent."""
    return per_device(s, name, "cpu").get("0", 0.0)


@dataclass
class LoopRun:
    """One run of a docs loop to its end: its answer, every scrape while it ran and one after its last step."""

    hello: dict[str, Any]
    interval: float  # its probe interval
    # (when, steps seen complete, probe runs, probe runs deferred), every scrape until the loop has ended
    seen: list[tuple[float, float, float, float]]
    final: Samples  # a scrape with every step counted
    log: str  # its stderr, once it has exited 0


def run_loop(tmp_path: Path, script: str, workload: str) -> LoopRun:
    """The loop as written, on 8 CPU devices, jaxmon at its defaults but for a short probe interval, a poll every
    0.1 s and a peak FLOP/s (CPU has none in the table): scraped while it steps, then once it has counted every
    step; then told to exit, which it must do with 0."""
    url = f"http://127.0.0.1:{free_port()}"
    interval, spacing = PROBE[script]
    env = {
        **ENV,
        "JAXMON_WEB__LISTEN_ADDRESS": url.removeprefix("http://"),
        "JAXMON_COLLECTOR__PROBE__INTERVAL": str(interval),
        "JAXMON_COLLECTOR__PROBE__SPACING": spacing,
        "JAXMON_POLL__INTERVAL": "0.1",  # the training series every 0.1 s (5 s by default)
    }
    child = Child(tmp_path, script=WORKLOADS / script, env=env, hello=False)
    try:
        hello: list[dict[str, Any]] = []
        greeter = threading.Thread(target=lambda: hello.append(child.greet(timeout=240)), daemon=True)
        greeter.start()
        lab = labels(workload)
        seen: list[tuple[float, float, float, float]] = []
        while greeter.is_alive():
            try:
                s = scrape(url, timeout=5)
            except requests.RequestException:  # not listening yet
                time.sleep(0.05)
                continue
            steps = sample(s, "jaxmon_training_steps_total", **lab) or 0.0
            runs, deferred = probe_counts(s, "jaxmon_probe_runs_total"), probe_counts(s, "jaxmon_probe_deferred_total")
            seen.append((time.monotonic(), steps, runs, deferred))
            time.sleep(0.05)
        greeter.join()
        assert hello, f"the loop did not finish; stderr:\n{child.log()}"
        total = hello[0]["steps"]
        final = wait_for_samples(
            url, lambda s: sample(s, "jaxmon_training_steps_total", **lab) == total, "the loop's steps"
        )
        assert child.proc.stdin is not None
        child.proc.stdin.write("\n")
        child.proc.stdin.flush()
        assert child.proc.wait(60) == 0, child.log()
        return LoopRun(hello[0], interval, seen, final, child.log())
    finally:
        child.close()


FirstRuns = Callable[[str], LoopRun]


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory: pytest.TempPathFactory) -> FirstRuns:
    """Each loop's first run, made once for the tests that read it: what it reported, and the probe beside it."""
    made: dict[str, LoopRun] = {}

    def first(script: str) -> LoopRun:
        if script not in made:
            workload = {"flax_loop.py": "flax-lm", "maxtext_loop.py": "maxtext-style"}[script]
            made[script] = run_loop(tmp_path_factory.mktemp(script.removesuffix(".py")), script, workload)
        return made[script]

    return first


def test_the_flax_nnx_loop_of_the_docs_reports_every_step(first_runs: FirstRuns) -> None:
    run = first_runs("flax_loop.py")
    done, s = run.hello, run.final
    steps, tokens = done["steps"], done["batch"] * done["seq"]
    lab = labels("flax-lm")
    assert sample(s, "jaxmon_training_step", **lab) == steps - 1
    assert sample(s, "jaxmon_training_examples_total", **lab) == steps * done["batch"]
    assert sample(s, "jaxmon_training_tokens_total", **lab) == steps * tokens
    assert problems(s) == {}
    # The step runs on one device: XLA's FLOPs there (nnx.jit tracked as is), the model FLOPs over every device.
    hardware = {d: v for d, v in per_device(s, "jaxmon_training_hardware_flops_total").items() if v}
    assert list(hardware.values()) == [pytest.approx(steps * done["flops"])], hardware
    model = per_device(s, "jaxmon_training_model_flops_total")
    assert len(model) == 8 and sum(model.values()) == pytest.approx(steps * 6 * done["n_params"] * tokens)
    assert per_device(s, "jaxmon_training_hardware_flops_utilization_ratio")  # a peak given: HFU is exported


def test_the_maxtext_style_loop_of_the_docs_reads_xla_flops_in_its_mesh(first_runs: FirstRuns) -> None:
    # Eight CPU devices, a 4 x 2 mesh: the loop keeps at most two steps in flight, as the docs say why.
    run = first_runs("maxtext_loop.py")
    done, s = run.hello, run.final
    steps, tokens = done["steps"], done["batch"] * done["seq"]
    lab = labels("maxtext-style")
    assert sample(s, "jaxmon_training_examples_total", **lab) == steps * done["batch"]
    assert sample(s, "jaxmon_training_tokens_total", **lab) == steps * tokens
    # The step constrains shardings with bare PartitionSpecs: it lowers only in the loop's mesh context, and
    # jaxmon.track() read its cost there (no "cost" problem), the same FLOPs on every device of the mesh.
    assert done["lowers_outside_mesh"] is False
    assert problems(s) == {}
    hardware = per_device(s, "jaxmon_training_hardware_flops_total")
    assert len(hardware) == 8 and all(v == pytest.approx(steps * done["flops"]) for v in hardware.values()), hardware
    model = per_device(s, "jaxmon_training_model_flops_total")
    assert all(v == pytest.approx(steps * 6 * done["n_params"] * tokens / 8) for v in model.values()), model
    mfu = per_device(s, "jaxmon_training_model_flops_utilization_ratio")
    assert len(mfu) == 8 and all(v > 0 for v in mfu.values()), mfu
    # Goodput's accounting holds to the scrape: productive plus every kind of badput is start to last step (the
    # timestamps are the wall clock's at each event: NTP's slew of it since the start, parts per million, is in them).
    badput = sum(v for k, v in s.items() if k[0] == "jaxmon_training_badput_seconds_total")
    productive = sample(s, "jaxmon_training_productive_seconds_total", **lab)
    last = sample(s, "jaxmon_training_last_step_timestamp_seconds", **lab)
    start = sample(s, "jaxmon_training_start_time_seconds", **lab)
    assert productive is not None and last is not None and start is not None
    assert productive + badput == pytest.approx(last - start, rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("run", range(2))  # twice each: an abort beside the probe was a matter of chance
@pytest.mark.parametrize(("script", "workload"), [("flax_loop.py", "flax-lm"), ("maxtext_loop.py", "maxtext-style")])
def test_the_docs_loops_run_to_the_end_with_no_probe_beside_their_steps(
    first_runs: FirstRuns, tmp_path: Path, script: str, workload: str, run: int
) -> None:
    """The loop exits 0, the probe never times out, and while the loop steps no probe runs
    (jaxmon_probe_runs_total is flat across scrapes a probe interval apart, while jaxmon_probe_deferred_total
    counts the runs left out). The first run is the one the tests above read; the second a run of its own."""
    loop = first_runs(script) if run == 0 else run_loop(tmp_path, script, workload)
    total, seen, interval, log = loop.hello["steps"], loop.seen, loop.interval, loop.log
    assert "probe did not finish" not in log, log
    assert "Termination timeout" not in log, log
    # Stepping: scrapes after the probe first left a run out for the job, and before the loop's last step.
    stepping = [x for x in seen if x[3] >= 1 and 1 <= x[1] < total]
    runs_while_stepping = [(round(t - seen[0][0], 2), steps, runs) for t, steps, runs, _ in seen if 1 <= steps < total]
    assert stepping, f"the probe never waited for the stepping loop: (s, steps, probe runs) {runs_while_stepping}"
    first, last = stepping[0], stepping[-1]
    assert last[0] - first[0] >= interval, f"too few scrapes while the loop stepped: {runs_while_stepping}"
    assert first[2] == last[2], f"the probe ran while the loop stepped: {runs_while_stepping}"
    assert last[3] > first[3]  # the probe's job ran meanwhile, and left its run out


def test_the_promql_of_training_md_parses(tmp_path: Path) -> None:
    text = "".join(
        (ROOT / "docs" / name).read_text() for name in ("training.md", "training-loops.md", "training-traces.md")
    )
    blocks = re.findall(r"^```promql\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 4  # every promql block of the three files
    rules = [{"record": f"docs:block{n}", "expr": block} for n, block in enumerate(blocks)]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}))
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
