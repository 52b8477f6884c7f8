"""Truth under churn, through real Prometheus servers: jobs that end every way a job ends, and a job that crashes and is
restarted from its checkpoint (tests/workloads/churn.py: a JAX loop under jaxmon.start() saving with the real Orbax).

- An HA pair: two Prometheus servers scrape three jobs with the shipped alerts (their `for:` shortened to 1 s). The
  one that ends normally pages nothing, the one killed by SIGKILL and the one ended by an uncaught exception each
  page JaxmonTrainingCrashed, and both servers hold the same alerts: each read every job's last word (the normal
  one's `jaxmon_exporter_stopping 1`), which jaxmon waited for no longer than a scrape interval and a second.
- A crash and a restart: the job raises after step 129, a supervisor (the test) starts it again on the same port,
  under the same workload name, and it restores Orbax's checkpoint of step 100 and runs to step 199. The shipped
  goodput (job.yml's jaxmon:training_goodput_ratio:rate5m, its window holding the whole job) equals the job's own,
  its useful steps' time (steps 0-100 of the first process, 101-199 of the second) over its wall time (from the first
  process's start to its last step), within 5 points (the rules price the redone steps at the window's mean
  productive seconds a step); the redone steps are the 29 it did twice, the disruption the time between the
  processes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.deploy_files import JOB_RULES, RULES
from tests.helpers import ROOT, free_port, importable, jaxmon_env, terminate, wait_until
from tests.prometheus import Prometheus

SCRIPT = ROOT / "tests" / "workloads" / "churn.py"


class Job:
    """tests/workloads/churn.py as a child process on `port`, its log in `directory`."""

    def __init__(self, directory: Path, port: int, workload: str, *args: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.stderr = open(directory / f"stderr-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(port), workload, str(directory), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=ROOT,
            env=jaxmon_env({"PYTHONPATH": importable()}),
        )

    def serving(self, timeout: float = 120.0) -> dict[str, Any]:
        """Its `OK {...}` once it serves."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("OK "), f"{line!r}: {self.log()}"
        return dict(json.loads(line[3:]))

    def end(self, how: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(how + "\n")
        self.proc.stdin.flush()

    def log(self) -> str:
        self.stderr.flush()
        return Path(self.stderr.name).read_text()

    def close(self) -> None:
        terminate(self.proc, timeout=5)
        self.stderr.close()


def steps(directory: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The processes' starts and their steps, from every log the job's processes wrote."""
    starts: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    for path in sorted(directory.glob("log-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            (starts if "started" in entry else done).append(entry)
    return sorted(starts, key=lambda e: e["started"]), sorted(done, key=lambda e: e["t1"])


def config(targets: list[str], rules: list[str], interval: str, timeout: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": timeout, "evaluation_interval": interval},
        "rule_files": rules,
        "scrape_configs": [{"job_name": "jaxmon-churn", "static_configs": [{"targets": targets}]}],
    }


def shortened(tmp: Path) -> str:
    """alerts.yml with every `for:` at 1 s."""
    path = tmp / "alerts.yml"
    path.write_text(re.sub(r"\bfor: \d+[smh]\b", "for: 1s", RULES.read_text(encoding="utf-8")), encoding="utf-8")
    return str(path)


def scraped(p: Prometheus, target: str, times: int) -> bool:
    """Whether `p` has scraped `target` `times` times since it first stepped (its training series in each)."""
    got = p.query(f'count_over_time(jaxmon_training_steps_total{{instance="{target}"}}[1m])')
    return bool(got) and float(got[0]["value"][1]) >= times


def history(p: Prometheus, expr: str, at: float) -> str:
    """The minute before `at` of `expr`, every half second: what a failing assertion shows."""
    params: dict[str, str | float] = {"query": expr, "start": at - 60, "end": at, "step": 0.5}
    r = requests.get(p.url + "/api/v1/query_range", params=params, timeout=20)
    return "\n".join(
        f"{series['metric']}: {[(round(float(t) - at, 1), v) for t, v in series['values']]}"
        for series in r.json()["data"]["result"]
    )


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.close()


def test_an_ha_pair_pages_for_the_killed_and_the_crashed_job_not_the_finished_one(
    tmp_path: Path, jobs: list[Job]
) -> None:
    ways = {"finished": "normal", "killed": "sigkill", "crashed": "exception"}
    ports = {name: free_port() for name in ways}
    targets = [f"127.0.0.1:{port}" for port in ports.values()]
    servers = []
    # One host, one User-Agent: the two servers' scrape timeouts tell their scrapes apart (jaxmon.scrapers), as
    # their addresses do where they run on hosts of their own.
    for name, timeout in (("a", "900ms"), ("b", "800ms")):
        (tmp_path / name).mkdir()
        server = Prometheus(tmp_path / name, config(targets, [shortened(tmp_path / name)], "1s", timeout))
        servers.append(server)
    try:
        for server in servers:
            server.wait_ready()
        for name, port in ports.items():
            jobs.append(Job(tmp_path / name, port, f"churn-{name}", "--until-told", "--save-every", "20"))
        for job in jobs:
            job.serving()
        # Every server has scraped every job a few times since it stepped (each is a regular scraper of each: its
        # interval known; each holds its training series).
        for server in servers:
            for target in targets:
                wait_until(functools.partial(scraped, server, target, 3), 120, f"{target} scraped")
        # A reader that is not Prometheus reads the finished job all along: it neither frees its wait nor is waited for.
        finished_url = f"http://{targets[0]}/metrics"
        reading = threading.Event()

        def curl() -> None:
            while not reading.is_set():
                with contextlib.suppress(requests.RequestException):
                    requests.get(finished_url, timeout=1)
                time.sleep(0.02)

        reader = threading.Thread(target=curl, daemon=True)
        reader.start()
        for job, how in zip(jobs, ways.values(), strict=True):
            job.end(how)
        codes = [job.proc.wait(60) for job in jobs]
        reading.set()
        assert codes == [0, -9, 1], [job.log()[-2000:] for job in jobs]
        # The finished job and the crashed one waited for both servers' next scrape (1 s apart), and no longer.
        for job in (jobs[0], jobs[2]):
            (said,) = [
                json.loads(line) for line in job.log().splitlines() if "jaxmon said how the process ends" in line
            ]
            assert said["scrapers"] == 2 and said["every_scraper_read_it"] is True, said
            assert said["waited_seconds"] <= 1.5 * 1.0 + 1.0, said
        # Each server holds each job's last word (a scrape it stored: a moment after it was served).
        words = {(targets[0], "normal"), (targets[2], "exception")}
        for server in servers:

            def said(server: Prometheus = server) -> set[tuple[str, str]]:
                got = server.query("last_over_time(jaxmon_exporter_exit_info[1m])")
                return {(r["metric"]["instance"], r["metric"]["reason"]) for r in got}

            wait_until(lambda: said() == words, 10, "the last words stored", detail=lambda: str(said()))
            stopping = server.query(f'last_over_time(jaxmon_exporter_stopping{{instance="{targets[0]}"}}[1m])')
            assert [r["value"][1] for r in stopping] == ["1"], stopping

        def firing(server: Prometheus) -> set[tuple[str, str, str]]:
            return {
                (r["metric"]["alertname"], r["metric"].get("workload", ""), r["metric"].get("reason", ""))
                for r in server.query('ALERTS{alertstate="firing"}')
            }

        expected = {
            ("JaxmonTrainingCrashed", "churn-killed", "killed"),
            ("JaxmonTrainingCrashed", "churn-crashed", "exception"),
        }
        for server in servers:
            wait_until(
                lambda server=server: firing(server) >= expected,  # type: ignore[misc]
                60,
                "the crashes paged",
                detail=functools.partial(lambda server: str(firing(server)), server),
            )
        time.sleep(3)  # a few more evaluations: nothing else fires (JaxmonExporterDown's for: is 1 s here)
        assert firing(servers[0]) == firing(servers[1]) == expected
    finally:
        for server in servers:
            server.stop()


def test_goodput_across_a_crash_and_a_restart_from_the_checkpoint_is_the_jobs_own(
    tmp_path: Path, jobs: list[Job]
) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    workload = "churn-restart"
    prometheus = Prometheus(tmp_path, config([target], [str(RULES), str(JOB_RULES)], "500ms", "450ms"))
    try:
        prometheus.wait_ready()
        first = Job(tmp_path / "job", port, workload, "--steps", "200", "--crash-after", "129")
        jobs.append(first)
        first.serving()
        assert first.proc.wait(120) == 1, first.log()[-2000:]
        assert "the job fails after step 129" in first.log()
        second = Job(tmp_path / "job", port, workload, "--steps", "200")  # the supervisor starts it again
        jobs.append(second)
        second.serving()
        assert second.proc.wait(120) == 0, second.log()[-2000:]
        at = time.time() + 2.0
        time.sleep(3.0)  # the rules evaluated past the last scrape
        starts, done = steps(tmp_path / "job")
        # Orbax's last save that completed before the crash: step 100's, or 50's where 100's was still being written.
        restored = starts[1]["restored"]
        assert starts[0]["restored"] is None and restored in (50, 100), starts
        first_steps = [e for e in done if e["t1"] < starts[1]["started"]]
        second_steps = [e for e in done if e["t1"] > starts[1]["started"]]
        assert [e["n"] for e in first_steps] == list(range(130))
        assert [e["n"] for e in second_steps] == list(range(restored + 1, 200))
        # The job's own goodput: its useful steps' productive seconds (the first process's up to the restored step,
        # and all of the second's, as each process's tracker booked them) over its wall time: what its processes
        # accounted and the time between them (the first's last step to the second's start). That wall time is the
        # loop's own, from the first process's jaxmon.start() to its last step, within a few milliseconds.
        useful = next(e for e in first_steps if e["n"] == restored)["productive"] + second_steps[-1]["productive"]
        gap = second_steps[-1]["start"] - first_steps[-1]["last"]
        wall = first_steps[-1]["accounted"] + gap + second_steps[-1]["accounted"]
        assert starts[0]["started"] <= done[-1]["t1"] - wall <= starts[0]["monitored"] + 0.05, (starts, wall)
        own = useful / wall
        shipped = prometheus.query(f'jaxmon:training_goodput_ratio:rate5m{{workload="{workload}"}} @ {at}')
        assert shipped, prometheus.query("jaxmon:training_goodput_ratio:rate5m")
        # Within a few points: the rules price the redone steps at the window's mean productive seconds a step (the
        # processes' own steps vary on a loaded machine), and increase() reads the counters half a scrape interval
        # past the last sample.
        parts = {
            q: prometheus.query(f'{q}{{workload="{workload}"}} @ {at}')
            for q in (
                "jaxmon:training_job_seconds:increase5m",
                "jaxmon:training_disruption_seconds:increase5m",
                "jaxmon:training_redone_seconds:increase5m",
                "jaxmon:training_redone_steps:increase5m",
            )
        }
        assert float(shipped[0]["value"][1]) == pytest.approx(own, abs=0.05), (own, useful, wall, gap, restored, parts)
        # The steps done twice, and the time between the processes: increase() reads the counters half a scrape
        # interval (0.25 s) past the last sample, which the steps (some 10 a second) and the accounted seconds show.
        redone = prometheus.query(f'jaxmon:training_redone_steps:increase5m{{workload="{workload}"}} @ {at}')
        pace = len(second_steps) / (second_steps[-1]["t1"] - second_steps[0]["t1"])  # steps a second
        (series,) = prometheus.query(f'jaxmon_training_steps_total{{workload="{workload}"}}[5m] @ {at}')
        stamps = [float(t) for t, _ in series["values"]]
        past = (stamps[-1] - stamps[0]) / (len(stamps) - 1) / 2  # increase()'s extrapolation: half a mean interval
        got = float(redone[0]["value"][1])
        assert 129 - restored - 1 <= got <= 129 - restored + past * pace + 1, (redone, pace, past)
        disruption = prometheus.query(f'jaxmon:training_disruption_seconds:increase5m{{workload="{workload}"}} @ {at}')
        assert float(disruption[0]["value"][1]) == pytest.approx(gap, abs=0.5), (disruption, gap)
        # What a crash now would lose, from Orbax's own save events: the second process's last save, of step 150,
        # taken once step 150 completed; and the interval the job declared (collector.checkpoint.interval_steps).
        saved = next(e for e in second_steps if e["n"] == 150)
        step = f'last_over_time(jaxmon_training_last_checkpoint_step{{workload="{workload}"}}[1m] @ {at})'
        assert [r["value"][1] for r in prometheus.query(step)] == ["150"]
        when = f'last_over_time(jaxmon_training_last_checkpoint_timestamp_seconds{{workload="{workload}"}}[1m] @ {at})'
        assert saved["t1"] <= float(prometheus.query(when)[0]["value"][1]) <= saved["t1"] + 1.0
        every = f'last_over_time(jaxmon_training_checkpoint_interval_steps{{workload="{workload}"}}[1m] @ {at})'
        assert [r["value"][1] for r in prometheus.query(every)] == ["50"]
        # The crash said it was one, and the restart is seen (both pending: their for: is longer than this test).
        crashed = prometheus.query(
            f'max_over_time(jaxmon:training_process_crashed{{workload="{workload}"}}[1m] @ {at})'
        )
        assert [r["metric"]["reason"] for r in crashed] == ["exception"], history(
            prometheus,
            "jaxmon:training_process_crashed or up or jaxmon_exporter_stopping or jaxmon_exporter_exit_info",
            at,
        )
        raised = prometheus.query(f'ALERTS{{workload="{workload}"}} @ {at}')
        assert {r["metric"]["alertname"] for r in raised} == {"JaxmonTrainingCrashed", "JaxmonTrainingRestarted"}, (
            raised
        )
    finally:
        prometheus.stop()


def test_sigterm_says_so_to_each_scraper_then_ends_the_process_by_it(tmp_path: Path, jobs: list[Job]) -> None:
    """A process with no SIGTERM handler of its own: jaxmon's says reason="signal" to the scrapers that come
    regularly (here one that identifies as Prometheus, every 0.3 s), then SIGTERM ends the process as it would have
    (killed by the signal, not an exit status)."""
    port = free_port()
    job = Job(tmp_path / "job", port, "churn-term", "--until-told")
    jobs.append(job)
    job.serving()
    bodies: list[str] = []
    stop = threading.Event()

    def prometheus() -> None:
        headers = {"User-Agent": "Prometheus/2.42.0", "X-Prometheus-Scrape-Timeout-Seconds": "0.25"}
        while not stop.is_set():
            with contextlib.suppress(requests.RequestException):
                bodies.append(requests.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=1).text)
            time.sleep(0.3)

    scraper = threading.Thread(target=prometheus, daemon=True)
    scraper.start()
    try:
        # Scraped a few times (a regular scraper: its interval known), the job stepping.
        wait_until(lambda: sum("jaxmon_training_step " in b for b in bodies) >= 3, 60, "three scrapes of the steps")
        job.proc.send_signal(signal.SIGTERM)
        assert job.proc.wait(30) == -signal.SIGTERM
    finally:
        stop.set()
        scraper.join()
    last = bodies[-1]
    assert 'jaxmon_exporter_exit_info{reason="signal",signal="SIGTERM"} 1.0' in last, last[-2000:]
    assert "jaxmon_exporter_stopping 0.0" in last  # a signal is no stop on purpose
    (said,) = [json.loads(line) for line in job.log().splitlines() if "jaxmon said how the process ends" in line]
    assert (said["reason"], said["signal"], said["scrapers"], said["every_scraper_read_it"]) == (
        "signal",
        "SIGTERM",
        1,
        True,
    )
