"""What Prometheus sees of a training job is what its counters say: a real Prometheus scrapes (every 0.5 s) one
workload whose process evals, checkpoints with Orbax and takes sampled traces, and restarts (tests/workloads/truth.py,
one child per run, on one port: a static target that comes and goes). Over the runs, `increase()` of every badput
kind, the productive seconds, the tokens and the sampled parts equals the sum of each run's own counters (as its
tracker has them), within what increase()'s extrapolation to the range's end can add (half a scrape interval's worth
of the average rate); the docs' goodput query and job.yml's record equal the runs' goodput; the loop's own timing of
its evals and saves agrees. This holds only because counters are born at zero (jaxmon.births): the startup and
compile badput, booked at the first step, would otherwise be a series' first value, which increase() cannot see.
Then the pages: the run that ended with jaxmon.stop() is not JaxmonExporterDown's, one that is killed is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_files import JOB_RULES, RULES
from tests.helpers import Child, free_port, wait_until
from tests.prometheus import Prometheus

Runs = tuple[Prometheus, list[dict[str, Any]], float, str]  # Prometheus, each run's answer, when they ended, the target
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "workloads" / "truth.py"
WORKLOAD = "truth"
SCRAPE = 0.5  # seconds (scrape_interval and evaluation_interval below)
RUNS = 2
SELECT = f'workload="{WORKLOAD}"'


def _value(p: Prometheus, expr: str) -> dict[str, float]:
    """An instant query's result by the value of its one grouping label ("" for a single series)."""
    out = {}
    for r in p.query(expr):
        labels = {k: v for k, v in r["metric"].items() if k != "__name__"}
        out[next(iter(labels.values()), "")] = float(r["value"][1])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("truth")
    port = free_port()
    target = f"127.0.0.1:{port}"
    config: dict[str, Any] = {
        "global": {"scrape_interval": "500ms", "scrape_timeout": "450ms", "evaluation_interval": "500ms"},
        "rule_files": [str(RULES), str(JOB_RULES)],
        "scrape_configs": [{"job_name": "jaxmon-truth", "static_configs": [{"targets": [target]}]}],
    }
    prometheus = Prometheus(tmp, config)
    children: list[Child] = []
    try:
        prometheus.wait_ready()
        answers = []
        for _ in range(RUNS):
            child = Child(tmp, str(port), WORKLOAD, str(tmp / "ckpt"), script=SCRIPT)
            children.append(child)
            scraped(prometheus, target, time.time())  # the run's first exposition is in Prometheus (born at zero)
            answers.append(child.send("run"))
            assert child.send("exit") == {"stopped": True}
            child.proc.wait(30)
        ended = time.time()
        time.sleep(3 * SCRAPE)  # the rules evaluated on the last scrapes
        yield prometheus, answers, ended, target
        # Then a run that dies (the test below reads it).
    finally:
        prometheus.stop()
        for child in children:
            child.close()


def scraped(prometheus: Prometheus, target: str, since: float) -> None:
    """Wait until Prometheus scraped `target` successfully after `since` (Unix time): its first scrape of a new
    target can come seconds after it is ready (its discovery sends targets at most every 5 s), and a run that ended
    before it would not be in it at all."""

    def done() -> bool:
        got = prometheus.query(f'timestamp(up{{instance="{target}"}} == 1)')
        return any(float(r["value"][1]) > since for r in got)

    wait_until(done, timeout=60, what=f"a scrape of {target}")


def test_increase_over_restarts_is_each_runs_counters(
    runs: Runs,
) -> None:
    p, answers, ended, _ = runs
    at = f"@ {ended + 2 * SCRAPE}"
    span = f"[{int(ended - answers[0]['start_time']) + 30}s]"
    # increase() extrapolates to the range's end by half the mean interval between the samples it read (to its start
    # by nothing: each series' first sample is 0, born at zero), so with n samples it reads at most the counters'
    # total x (1 + 1 / (2 (n - 1))), restarts' gaps (no samples) included.

    def close(got: float, want: float, what: str, family: str) -> None:
        counts = _value(p, f"min(count_over_time({family}{{{SELECT}}}{span} {at}))")
        slack = 1 / (2 * (counts[""] - 1))
        assert want <= got + 1e-6 and got <= want * (1 + slack) + 1e-3, (
            f"{what}: Prometheus {got}, the runs' counters {want} ({counts['']:.0f} samples)"
        )

    badput = _value(p, f"sum by (kind) (increase(jaxmon_training_badput_seconds_total{{{SELECT}}}{span} {at}))")
    kinds = {k for a in answers for k in a["badput"]}
    assert {"startup", "compile", "checkpoint", "eval", "host"} <= kinds
    for kind in kinds:
        want = sum(a["badput"].get(kind, 0.0) for a in answers)
        close(badput.get(kind, 0.0), want, f"badput {kind}", "jaxmon_training_badput_seconds_total")
    assert sum(a["badput"]["startup"] for a in answers) > 0 and sum(a["badput"]["compile"] for a in answers) > 0
    productive = sum(a["productive"] for a in answers)
    got = _value(p, f"sum(increase(jaxmon_training_productive_seconds_total{{{SELECT}}}{span} {at}))")[""]
    close(got, productive, "productive", "jaxmon_training_productive_seconds_total")
    tokens = _value(p, f"sum(increase(jaxmon_training_tokens_total{{{SELECT}}}{span} {at}))")[""]
    close(tokens, sum(a["tokens"] for a in answers), "tokens", "jaxmon_training_tokens_total")
    # The docs' goodput over the runs (docs/metrics.md).
    prod = f"sum(increase(jaxmon_training_productive_seconds_total{{{SELECT}}}{span} {at}))"
    bad = f"sum(increase(jaxmon_training_badput_seconds_total{{{SELECT}}}{span} {at}))"
    goodput = _value(p, f"{prod} / ({prod} + {bad})")[""]
    lost = sum(sum(a["badput"].values()) for a in answers)
    assert goodput == pytest.approx(productive / (productive + lost), abs=0.005)
    # The sampled traces' parts and results.
    parts = _value(p, f"sum by (part) (increase(jaxmon_training_profile_seconds_total{{{SELECT}}}{span} {at}))")
    for part in ("compute", "collective", "copy", "idle"):
        want = sum(a["parts"].get(part, 0.0) for a in answers)
        close(parts.get(part, 0.0), want, f"part {part}", "jaxmon_training_profile_seconds_total")
    assert sum(a["parts"]["compute"] for a in answers) > 0
    # Each run's samples are those its eval and save cadence implies (tests/workloads/truth.py): those whose steps
    # held an eval or a save skipped, and tried again on clean steps.
    assert [a["results"] for a in answers] == [{"taken": 4, "busy": 0, "failed": 0, "skipped": 4}] * RUNS
    results = _value(p, f"sum by (result) (increase(jaxmon_training_profiles_total{{{SELECT}}}{span} {at}))")
    for result in ("taken", "skipped"):
        want = sum(a["results"][result] for a in answers)
        close(results[result], want, f"samples {result}", "jaxmon_training_profiles_total")
    # Each restart is a reset Prometheus sees, and the start time tells the processes apart.
    resets = _value(p, f"max(resets(jaxmon_training_badput_seconds_total{{{SELECT}, kind='compile'}}{span} {at}))")
    assert resets[""] == RUNS - 1
    starts = _value(p, f"max(changes(jaxmon_training_start_time_seconds{{{SELECT}}}{span} {at}))")
    assert starts[""] == RUNS - 1


def test_the_loops_own_timing_agrees(runs: Runs) -> None:
    """The eval and checkpoint badput against the seconds the loop measured around them. An eval is booked from
    jaxmon's clock inside the loop's brackets (the two differ by the clocks' reads alone). A save is what Orbax
    timed of it (from a moment after the call, to a log line before its end), begun earlier where Orbax's start event
    came earlier: at least Orbax's own time, at most the loop's (a loaded machine puts milliseconds between them)."""
    _, answers, _, _ = runs
    for a in answers:
        assert a["badput"]["eval"] == pytest.approx(a["measured"]["eval"], rel=0.05, abs=0.005), a
        assert a["badput"]["eval"] <= a["measured"]["eval"] + 0.001, a
        assert a["timed"]["checkpoint"] > 0
        assert a["timed"]["checkpoint"] - 0.001 <= a["badput"]["checkpoint"] <= a["measured"]["checkpoint"] + 0.001, a


def test_job_rules_goodput_and_tokens(runs: Runs) -> None:
    """job.yml's records, 2 scrapes after the last run ended: goodput over the last 5 minutes (both runs). The runs
    are one job's processes one after the other, each from step 0: the second computes every step of the first
    again (their productive seconds are redone badput, taken out of the goodput), and the time between the first's
    last step and the second's start is disruption badput."""
    p, answers, ended, _ = runs
    assert RUNS == 2
    first, second = answers
    accounted = sum(a["productive"] + sum(a["badput"].values()) for a in answers)
    gap = second["start_time"] - first["last_step"]
    recorded = _value(p, f"jaxmon:training_goodput_ratio:rate5m{{{SELECT}}} @ {ended + 2 * SCRAPE}")[WORKLOAD]
    assert recorded == pytest.approx(second["productive"] / (accounted + gap), abs=0.02)
    kinds = _value(p, f"jaxmon:training_badput_ratio:rate5m{{{SELECT}}} @ {ended + 2 * SCRAPE}")
    assert kinds["disruption"] * (accounted + gap) == pytest.approx(gap, abs=2 * SCRAPE)
    assert sum(kinds.values()) == pytest.approx(1 - recorded, abs=1e-6)


def test_a_finished_run_does_not_page_and_a_killed_one_does(runs: Runs, tmp_path: Path) -> None:
    p, _, _, target = runs
    down = 'up{job="jaxmon-truth"} == 0 unless on (job, instance) jaxmon:exporter_stopped'
    stopped = p.query(f'jaxmon:exporter_stopped{{instance="{target}"}}')
    assert [r["value"][1] for r in stopped] == ["1"], stopped
    assert p.query(down) == []  # finished: JaxmonExporterDown's expression is quiet
    port = target.rsplit(":", 1)[1]
    child = Child(tmp_path, port, WORKLOAD, str(tmp_path / "ckpt"), script=SCRIPT)
    try:
        p.wait_for(f'up{{instance="{target}"}}', lambda r: bool(r) and r[0]["value"][1] == "1", "the new run up")
        child.proc.stdin.write("crash\n")  # type: ignore[union-attr]
        child.proc.stdin.flush()  # type: ignore[union-attr]
        child.proc.wait(60)
        p.wait_for(down, lambda r: len(r) == 1, "a killed run is JaxmonExporterDown's", timeout=20)
    finally:
        child.close()
