"""The job view end to end: deploy/prometheus/job.yml in a real Prometheus, over a real multi-process JAX job.

- The job: four processes of tests/workloads/job.py joined by jax.distributed (CPU devices, gloo collectives on
  loopback), each step a cross-process reduction, each process with jaxmon embedded (its probe off: four CPU
  "devices" sharing this machine's two cores say nothing about device speed; the NVML fake below does). The tests
  make process 2 host-bound (a delay before each dispatch) and then stall process 3 (it stops dispatching and
  keeps serving), and the rules must name that process and no other.
- The devices: a node-mode jaxmon (no JAX) reading the NVML fake's eight GPUs, one of them clocked down by a
  thermal slowdown, and the spool of a publishing workload whose memory is skewed onto one device.
- Prometheus scrapes every second and evaluates the shipped rules with their 5-minute windows shortened to 15 s,
  their `for:` to 4 s and the stall parameter to 6 s; nothing else in them is changed. alerts.yml is loaded beside
  them with its `for:` at 4 s and JaxmonTrainingStalled's 300 s floor at 10 s (above the stall parameter, as in
  the shipped files), so that a stall shows its one page: JaxmonTrainingProcessStalled for the culprit, and no
  JaxmonTrainingStalled beside it.
- Every process passes the job's figures to jaxmon.step() (the global batch and its tokens): the job's tokens/s
  summed over its processes' series must be what the loop measures.

The tests of the job run in file order on one job (the stall is last: the others then wait for process 3 forever).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Daemon, free_port, wait_until
from tests.deploy_files import JOB_DASHBOARD, JOB_RULES, RULES, dashboard_targets
from tests.fakenvml import Scenario, device
from tests.helpers import Child
from tests.prometheus import Prometheus

JOB = ROOT / "tests" / "workloads" / "job.py"
PROCESSES = 4
WORKLOAD = "llama"
DEVICE_WORKLOAD = "skewed"
THROTTLED_GPU = 5
SKEWED_DEVICE = 3
# nvml.h: nvmlClocksEventReasonHwThermalSlowdown.
HW_THERMAL = 0x40
JOB_ALERTS = ("JaxmonTrainingStraggler", "JaxmonTrainingProcessStalled", "JaxmonDeviceMemorySkew")
STALL_ALERTS = ("JaxmonTrainingProcessStalled", "JaxmonTrainingStalled")


def clocks(sm_mhz: int) -> dict[str, int]:
    """The fake GPU's current clocks with the SM (and graphics) clock at `sm_mhz`."""
    return {"graphics": sm_mhz, "sm": sm_mhz, "memory": 2619, "video": 1755}


def shortened_rules(tmp: Path) -> Path:
    """job.yml with windows of 15 s, `for:` of 4 s and a 6 s stall parameter, for a test that lasts a minute."""
    text = JOB_RULES.read_text(encoding="utf-8")
    text = text.replace("[5m]", "[15s]")
    text = re.sub(r"\bfor: \d+m\b", "for: 4s", text)
    text, stall = re.subn(r"(record: jaxmon:param:process_stall_seconds\n\s+expr: )vector\(\d+\)", r"\1vector(6)", text)
    assert stall == 1 and "[5m]" not in text and "for: 4s" in text
    path = tmp / "job.yml"
    path.write_text(text, encoding="utf-8")
    return path


def shortened_alerts(tmp: Path) -> Path:
    """alerts.yml with `for:` of 4 s and JaxmonTrainingStalled's 300 s floor at 10 s (the stall parameter is 6 s)."""
    text = RULES.read_text(encoding="utf-8")
    text = re.sub(r"\bfor: \d+[mh]\b", "for: 4s", text)
    floor = "jaxmon_training_step_duration_seconds_count, 300)"
    assert text.count(floor) == 1
    text = text.replace(floor, "jaxmon_training_step_duration_seconds_count, 10)")
    path = tmp / "alerts.yml"
    path.write_text(text, encoding="utf-8")
    return path


@dataclass
class View:
    prometheus: Prometheus
    job: list[Child]  # by process index

    def alerts(self, name: str, state: str = "") -> list[dict[str, str]]:
        """The label sets of `name`'s alerts (pending and firing, or only `state`)."""
        selector = f'alertname="{name}"' + (f', alertstate="{state}"' if state else "")
        return [r["metric"] for r in self.prometheus.query(f"ALERTS{{{selector}}}")]

    def wait_firing(self, name: str, workload: str, timeout: float = 90.0) -> list[dict[str, str]]:
        """`name`'s firing alerts, once one fires for `workload`."""
        expr = f'ALERTS{{alertname="{name}", alertstate="firing", workload="{workload}"}}'
        self.prometheus.wait_for(expr, bool, f"{name} firing for {workload}", timeout)
        return self.alerts(name, "firing")


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[View]:
    tmp = tmp_path_factory.mktemp("job-view")
    coordinator = f"127.0.0.1:{free_port()}"
    job: list[Child] = []
    daemons: list[Daemon] = []
    prometheus: Prometheus | None = None
    try:
        for index in range(PROCESSES):
            args = ["--coordinator", coordinator, "--processes", str(PROCESSES), "--process-id", str(index)]
            job.append(Child(tmp, *args, "--workload", WORKLOAD, script=JOB, hello=False))
        # Each answers once jax.distributed has all of them.
        assert [c.greet(120)["process_index"] for c in job] == list(range(PROCESSES))

        # The device side: eight fake GPUs, GPU 5 clocked down by a thermal slowdown while the others run at their
        # clock; a publisher of workload "skewed" reports to the same jaxmon (so its GPUs serve that workload).
        scenario = Scenario(tmp / "nvml.json", [device(i, clocks_mhz=clocks(1980)) for i in range(8)])
        scenario.update(THROTTLED_GPU, clocks_mhz=clocks(1200), clocks_event_reasons=HW_THERMAL)
        spool = tmp / "spool"
        spool.mkdir()
        node = Daemon(
            tmp / "node",
            ["--node", "--collector.nvml", "--collector.spool.dir", str(spool), "--poll.interval", "0.5s"],
            env=scenario.env(),
        )
        daemons.append(node)
        node.wait_ready()
        publisher = Child(tmp, "publish", "--spool", str(spool), "--workload", DEVICE_WORKLOAD, "--interval", "0.3")
        job.append(publisher)
        # 8 MiB on each of the 8 devices, and 8 MiB more on device 3: twice the median device.
        publisher.send(f"shard {8 * 8 << 20}")
        publisher.send(f"alloc {SKEWED_DEVICE} {8 << 20}")

        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(shortened_rules(tmp)), str(shortened_alerts(tmp))],
            "scrape_configs": [
                {
                    "job_name": "jaxmon-job",
                    "static_configs": [{"targets": [c.hello["url"].removeprefix("http://") for c in job[:PROCESSES]]}],
                },
                {"job_name": "jaxmon-node", "static_configs": [{"targets": [f"127.0.0.1:{node.port}"]}]},
            ],
        }
        prometheus = Prometheus(tmp, config)
        prometheus.wait_ready()
        yield View(prometheus, job[:PROCESSES])
    finally:
        if prometheus is not None:
            prometheus.stop()
        for child in job:
            child.close()
        for daemon in daemons:
            daemon.stop()


def _indexes(alerts: list[dict[str, str]]) -> set[str]:
    return {a.get("process_index", "") for a in alerts if a.get("workload") == WORKLOAD}


def test_a_steady_job_fires_nothing(view: View) -> None:
    p = view.prometheus
    p.wait_for(
        f'jaxmon:training_host_score{{workload="{WORKLOAD}"}}',
        lambda r: len(r) == PROCESSES,
        "a host score for every process",
        timeout=90,
    )
    # Watched for three times the alerts' `for:` (4 s): no job alert is pending or firing for the job.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        for name in JOB_ALERTS:
            assert _indexes(view.alerts(name)) == set(), (name, view.alerts(name))
        time.sleep(0.5)
    scores = {r["metric"]["process_index"]: float(r["value"][1]) for r in p.query("jaxmon:training_host_score")}
    assert set(scores) == {str(i) for i in range(PROCESSES)} and min(scores.values()) > 0.8, scores


def test_the_jobs_tokens_per_second_is_the_sum_over_its_processes(view: View) -> None:
    """Every process passes the job's global batch and tokens to jaxmon.step() and exports its share: sum() over
    the job's series is the job's tokens/s, as the loop measures it (within 5 %)."""
    # A minute of steps in Prometheus first: rate() over [1m] of a series younger than the window under-reads (it
    # extrapolates at most a scrape interval past the first sample), and Prometheus's first scrape of the job comes
    # some seconds after the loop's first step. A sample 62 s old says the window is covered.
    started = float(view.job[0].send("status")["started"])
    assert started > 0
    view.prometheus.wait_for(
        f'jaxmon_training_tokens_total{{workload="{WORKLOAD}"}} offset 62s',
        lambda r: len(r) == PROCESSES,
        "a minute of every process's tokens in Prometheus",
        timeout=150,
    )
    status = view.job[0].send("status")
    measured, at = float(status["tokens_per_second"]), float(status["time"])
    assert measured > 0, status
    (result,) = view.prometheus.api(
        "query", query=f'sum(rate(jaxmon_training_tokens_total{{workload="{WORKLOAD}"}}[1m]))', time=at
    )["result"]
    exported = float(result["value"][1])
    steps = view.prometheus.query(f'rate(jaxmon_training_steps_total{{workload="{WORKLOAD}"}}[1m])')
    problems = view.prometheus.query("jaxmon_training_tracking_problems_total")
    assert exported == pytest.approx(measured, rel=0.05), (exported, measured, status, steps, problems)
    # Each process exports a quarter of it.
    shares = view.prometheus.api(
        "query", query=f'rate(jaxmon_training_tokens_total{{workload="{WORKLOAD}"}}[1m])', time=at
    )["result"]
    assert len(shares) == PROCESSES
    for share in shares:
        assert float(share["value"][1]) == pytest.approx(measured / PROCESSES, rel=0.05), shares


def test_a_host_bound_process_is_the_straggler_and_no_other(view: View) -> None:
    view.job[2].send("delay 150")
    firing = view.wait_firing("JaxmonTrainingStraggler", WORKLOAD)
    assert _indexes(firing) == {"2"}, firing
    (alert,) = [a for a in firing if a.get("workload") == WORKLOAD]
    assert alert["severity"] == "warning" and alert["process_count"] == str(PROCESSES)
    # The job's other processes wait for it in the collective: their host waits stay at the job's median.
    scores = {
        r["metric"]["process_index"]: float(r["value"][1]) for r in view.prometheus.query("jaxmon:training_host_score")
    }
    assert min(scores, key=lambda k: scores[k]) == "2" and scores["2"] < 0.5, scores
    assert all(scores[str(i)] > 0.8 for i in (0, 1, 3)), scores
    # The Job dashboard shows it first, with the variables Grafana would give it.
    values = {"$workload": WORKLOAD, "$k": "3", "$__rate_interval": "10s"}
    for title, ref, expr in dashboard_targets(JOB_DASHBOARD):
        for name, value in values.items():
            expr = expr.replace(name, value)
        result = view.prometheus.query(expr)
        if title == "Lowest host scores":
            assert result and min(result, key=lambda r: float(r["value"][1]))["metric"]["process_index"] == "2"
        elif "energy" in expr:
            # The job's devices are CPU devices: no NVML energy counter serves it, and the rule says nothing.
            assert result == [], f"{title} {ref}: {expr} returned {result}"
        elif "ALERTS" not in expr and "device" not in title.lower() and "memory" not in title.lower():
            assert result, f"{title} {ref}: {expr} returned nothing"
    # `jaxmon top --once` over the job's endpoints groups them as one job and marks process 2 (its devices have
    # waited for its host since the delay began; the others' hardly ever).
    urls = [c.hello["url"] for c in view.job]
    top = subprocess.run(
        [sys.executable, "-m", "jaxmon", "top", "--once", *urls], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert top.returncode == 0, top.stderr
    assert f"job {WORKLOAD}: {PROCESSES} processes" in top.stdout, top.stdout
    assert "slowest: process 2 on " in top.stdout, top.stdout
    view.job[2].send("delay 0")


def test_the_throttled_gpu_is_named_by_the_rules(view: View) -> None:
    firing = view.wait_firing("JaxmonTrainingStraggler", DEVICE_WORKLOAD)
    devices = [a for a in firing if a.get("workload") == DEVICE_WORKLOAD]
    assert [(a["device"], a["signal"], a["job"]) for a in devices] == [(str(THROTTLED_GPU), "sm_clock", "jaxmon-node")]
    speeds = view.prometheus.query(f'jaxmon:device_speed:relative{{workload="{DEVICE_WORKLOAD}"}}')
    by_device = {r["metric"]["device"]: float(r["value"][1]) for r in speeds}
    assert set(by_device) == {str(i) for i in range(8)}
    assert by_device[str(THROTTLED_GPU)] == pytest.approx(1200 / 1980)
    assert all(by_device[str(i)] == 1.0 for i in range(8) if i != THROTTLED_GPU)


def test_memory_skew_names_the_device(view: View) -> None:
    firing = view.wait_firing("JaxmonDeviceMemorySkew", DEVICE_WORKLOAD)
    skewed = [a for a in firing if a.get("workload") == DEVICE_WORKLOAD]
    assert [(a["device"], a["platform"]) for a in skewed] == [(str(SKEWED_DEVICE), "cpu")], firing
    # Nothing else skews: the job's processes hold equal shards.
    assert [a for a in firing if a.get("workload") == WORKLOAD] == []
    (relative,) = view.prometheus.query(
        f'jaxmon:workload_device_memory_bytes:relative{{workload="{DEVICE_WORKLOAD}", device="{SKEWED_DEVICE}"}}'
    )
    assert float(relative["value"][1]) == pytest.approx(2.0, rel=0.01)


def test_a_stalled_process_is_named_and_not_the_ones_waiting_for_it(view: View) -> None:
    stalled = view.job[3].send("stall")["dispatched"]
    firing = view.wait_firing("JaxmonTrainingProcessStalled", WORKLOAD)
    assert _indexes(firing) == {"3"}, firing
    dispatched = {
        r["metric"]["process_index"]: float(r["value"][1])
        for r in view.prometheus.query(f'jaxmon_training_dispatched_step{{workload="{WORKLOAD}"}}')
    }
    assert dispatched["3"] == stalled and all(dispatched[str(i)] > stalled for i in (0, 1, 2)), dispatched
    # The others have completed nothing either since (they wait in the collective), and stay unnamed.
    wait_until(lambda: _indexes(view.alerts("JaxmonTrainingProcessStalled")) == {"3"}, 5, "only process 3")
    # One stall, one page: past JaxmonTrainingStalled's floor (10 s here) and its `for:` (4 s), with every process
    # stalled by its measure, the only critical stall alert, pending or firing, is process 3's.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        critical = [
            a
            for name in STALL_ALERTS
            for a in view.alerts(name)
            if a.get("workload") == WORKLOAD and a.get("severity") == "critical"
        ]
        assert [(a["alertname"], a.get("process_index")) for a in critical] == [
            ("JaxmonTrainingProcessStalled", "3")
        ], critical
        time.sleep(0.5)
    # JaxmonTrainingStalled's own condition does hold for the workload's processes: only the culprit silences it.
    ages = view.prometheus.query(f'time() - jaxmon_training_last_step_timestamp_seconds{{workload="{WORKLOAD}"}} > 10')
    assert len(ages) == PROCESSES, ages
