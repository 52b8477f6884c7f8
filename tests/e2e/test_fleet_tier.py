"""The fleet tier end to end (docs/scale.md): the raw series stay in the slice's Prometheus, the fleet receives only
deploy/prometheus/fleet.yml's records, and their number per job does not grow with the job.

- Two synthetic jobs on loopback (a small exposition server in this process, one target per 64 processes, each
  series labelled with its process's own `job` and `instance`, as a scrape of each embedded jaxmon would): "small"
  of 64 processes and "large" of 512, 4 devices each, every series the job and fleet rules read with the exporter's
  names and labels. Each step 0.1 s, each process's share of the job's 1,000 tokens a second; sampled traces every
  3 s, process 3's device 1 waiting least in the collectives (a compute straggler) in both jobs.
- The slice: a Prometheus that scrapes them every 2 s and evaluates the shipped job.yml and fleet.yml (their
  5-minute and 1-minute windows at 10 s, their hour at 20 s and its once-a-minute records every 2 s, `for:` at 4 s;
  nothing else changed), and
  remote_writes the records alone (write_relabel_configs keeping `jaxmon:fleet_.+`, `via="slice"` added).
- An agent: Debian's Prometheus in agent mode, which scrapes the slice's /federate for the records and
  remote_writes them (the same write_relabel_configs; external label `via="agent"`).
- The receiver: a Prometheus with --web.enable-remote-write-receiver and nothing to scrape.

The receiver must hold each job's records by both paths, the same number of series for the 512-process job as for
the 64-process one, under 300, with no process or device label but the straggler's (which names process 3), and
the figures the jobs were built with (processes, tokens per second).
"""

from __future__ import annotations

import http.server
import math
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jaxmon.training.ledger import DURATION_BUCKETS
from tests.deploy_files import FLEET_RULES, JOB_RULES
from tests.helpers import free_port, text_targets
from tests.prometheus import LoopbackServer, Prometheus

JOBS = {"small": 64, "large": 512}
DEVICES = 4
SHARD = 64  # processes per target
STEP = 0.1  # seconds a step
TOKENS_PER_SECOND = 1000.0  # the job's
SAMPLE_EVERY = 3.0  # seconds between sampled traces
STRAGGLER = 3
KEEP = "jaxmon:fleet_.+"
SERIES_BOUND = 300
LE = (*DURATION_BUCKETS, math.inf)


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class SyntheticJob:
    """One job's processes as their exporters would serve them, each number a function of time."""

    def __init__(self, workload: str, processes: int, began: float) -> None:
        self.workload = workload
        self.processes = processes
        self.began = began

    def process(self, p: int) -> dict[str, str]:
        return {
            "job": "jaxmon",
            "instance": f"{self.workload}-{p}:10401",
            "workload": self.workload,
            "process_index": str(p),
            "process_count": str(self.processes),
            "host": f"{self.workload}-{p}",
        }

    def render(self, ps: range, now: float) -> str:
        up = now - self.began
        steps = math.floor(up / STEP)
        sample = math.floor(up / SAMPLE_EVERY) * 1000
        lines = []
        for p in ps:
            labels = self.process(p)
            lab = _labels(labels)
            # Every step of 0.1 s: all of them in the buckets from 0.1 up.
            for le in LE:
                bound = "+Inf" if le == math.inf else repr(float(le))
                count = steps if le >= STEP else 0
                lines.append(f"jaxmon_training_step_duration_seconds_bucket{_labels({**labels, 'le': bound})} {count}")
            lines.append(f"jaxmon_training_step_duration_seconds_count{lab} {steps}")
            lines.append(f"jaxmon_training_step_duration_seconds_sum{lab} {steps * STEP}")
            lines.append(f"jaxmon_training_steps_total{lab} {steps + 1}")
            lines.append(f"jaxmon_training_host_wait_seconds_total{lab} {0.01 * up}")
            lines.append(f"jaxmon_training_last_step_timestamp_seconds{lab} {self.began + steps * STEP}")
            lines.append(f"jaxmon_training_productive_seconds_total{lab} {0.9 * up}")
            for kind, share in (("checkpoint", 0.06), ("data", 0.04)):
                lines.append(f"jaxmon_training_badput_seconds_total{_labels({**labels, 'kind': kind})} {share * up}")
            lines.append(f"jaxmon_training_tokens_total{lab} {TOKENS_PER_SECOND / self.processes * up}")
            lines.append(f"jaxmon_training_examples_total{lab} {8 / self.processes * up}")
            if sample:
                lines.append(f"jaxmon_training_profile_sample_step{lab} {sample}")
            for i in range(DEVICES):
                device = str(DEVICES * p + i)
                dev = _labels({**labels, "device": device, "platform": "tpu"})
                lines.append(f"jaxmon_training_model_flops_utilization_ratio{dev} {0.4 + 0.01 * (p % 7)}")
                if sample:
                    wait = 0.05 if (p, i) == (STRAGGLER, 1) else 0.4 + 0.01 * ((p + i + sample // 1000) % 3)
                    lines.append(f"jaxmon_training_collective_wait_ratio{dev} {wait}")
                info = {
                    "job": "jaxmon",
                    "instance": labels["instance"],
                    "device": device,
                    "platform": "tpu",
                    "source": "local",
                    "device_kind": "TPU v5 lite",
                    "process_index": str(p),
                    "coords": "",
                    "core_on_chip": "",
                    "workload": self.workload,
                }
                lines.append(f"jaxmon_device_info{_labels(info)} 1")
        return "\n".join(lines) + "\n"


@dataclass
class Target:
    job: SyntheticJob
    processes: range


def serve(targets: list[Target]) -> http.server.ThreadingHTTPServer:
    """/metrics/K: target K's processes now."""

    def render(k: int) -> bytes:
        return targets[k].job.render(targets[k].processes, time.time()).encode()

    server = text_targets(render, len(targets), free_port())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def shortened(path: Path, tmp: Path) -> Path:
    """A rules file with its windows of 5 minutes and of a minute at 10 s, of an hour at 20 s, `for:` at 4 s."""
    text = path.read_text(encoding="utf-8")
    text = text.replace("[5m]", "[10s]").replace("[1m]", "[10s]").replace("[1h]", "[20s]")
    text = text.replace("interval: 1m", "interval: 2s")  # job.yml's once-a-minute records: at each evaluation
    text = re.sub(r"\bfor: \d+m\b", "for: 4s", text)
    out = tmp / path.name
    out.write_text(text, encoding="utf-8")
    return out


def forwarded(receiver: Prometheus, via: str) -> dict[str, Any]:
    """A remote_write to the receiver of the fleet records alone, labelled `via`."""
    return {
        "url": f"{receiver.url}/api/v1/write",
        "write_relabel_configs": [
            {"source_labels": ["__name__"], "regex": KEEP, "action": "keep"},
            {"target_label": "via", "replacement": via, "action": "replace"},
        ],
        "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
    }


class Agent(LoopbackServer):
    """Debian's Prometheus in agent mode (2.42: `--enable-feature=agent`): scrapes and remote_writes, no rules."""

    name = "agent"

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        super().__init__(
            tmp,
            config,
            "prometheus",
            ["--enable-feature=agent", f"--storage.agent.path={tmp / 'wal'}", "--log.level=warn"],
        )


class Receiver(Prometheus):
    """A Prometheus that takes remote writes (--web.enable-remote-write-receiver) and scrapes nothing."""

    def __init__(self, tmp: Path) -> None:
        LoopbackServer.__init__(
            self,
            tmp,
            {"global": {"scrape_interval": "15s"}},
            "prometheus",
            [
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                "--storage.tsdb.retention.time=1h",
                "--web.enable-remote-write-receiver",
                "--log.level=warn",
            ],
        )


@dataclass
class Tier:
    slice: Prometheus
    receiver: Prometheus


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    began = time.time()
    targets = []
    for workload, processes in JOBS.items():
        job = SyntheticJob(workload, processes, began)
        targets += [Target(job, range(p, min(processes, p + SHARD))) for p in range(0, processes, SHARD)]
    server = serve(targets)
    port = server.server_address[1]
    servers: list[LoopbackServer] = []
    try:
        receiver = Receiver(tmp_path_factory.mktemp("receiver"))
        servers.append(receiver)
        receiver.wait_ready()
        tmp = tmp_path_factory.mktemp("slice")
        slice_config = {
            "global": {
                "scrape_interval": "2s",
                "scrape_timeout": "1900ms",
                "evaluation_interval": "2s",
                "external_labels": {"slice": "a"},
            },
            "rule_files": [str(shortened(JOB_RULES, tmp)), str(shortened(FLEET_RULES, tmp))],
            "scrape_configs": [
                {
                    "job_name": "synthetic",
                    "honor_labels": True,  # each series carries its own process's job and instance
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}"], "labels": {"__metrics_path__": f"/metrics/{k}"}}
                        for k in range(len(targets))
                    ],
                }
            ],
            "remote_write": [forwarded(receiver, "slice")],
        }
        slice_prometheus = Prometheus(tmp, slice_config)
        servers.append(slice_prometheus)
        slice_prometheus.wait_ready()
        agent_config = {
            "global": {"scrape_interval": "2s"},
            "scrape_configs": [
                {
                    "job_name": "fleet-federate",
                    "honor_labels": True,
                    "metrics_path": "/federate",
                    "params": {"match[]": [f'{{__name__=~"{KEEP}"}}']},
                    "static_configs": [{"targets": [f"127.0.0.1:{slice_prometheus.port}"]}],
                }
            ],
            "remote_write": [forwarded(receiver, "agent")],
        }
        agent = Agent(tmp_path_factory.mktemp("agent"), agent_config)
        servers.append(agent)
        agent.wait_ready()
        yield Tier(slice_prometheus, receiver)
    finally:
        for s in reversed(servers):
            s.stop()
        server.shutdown()


FLEET = f'{{__name__=~"{KEEP}"}}'
PATHS = ("slice", "agent")


def per_job(receiver: Prometheus) -> dict[tuple[str, str], int]:
    """The fleet records' series per (job, path) at the receiver."""
    result = receiver.query(f"count by (workload, via) ({FLEET})")
    return {(r["metric"]["workload"], r["metric"]["via"]): int(float(r["value"][1])) for r in result}


def test_the_records_arrive_by_both_paths_and_their_count_does_not_grow_with_the_job(tier: Tier) -> None:
    receiver = tier.receiver
    # Every job's straggler named (its alert fired in the slice) by both paths: the records are complete by then.
    receiver.wait_for(
        'count by (workload, via) (jaxmon:fleet_straggler:firing{process_index="3"})',
        lambda r: len(r) == len(JOBS) * len(PATHS),
        "each job's compute straggler at the receiver by both paths",
        timeout=120,
    )
    time.sleep(6)  # three more evaluations and sends: every record of the last evaluation is there
    counts = per_job(receiver)
    assert set(counts) == {(job, via) for job in JOBS for via in PATHS}, counts
    assert len(set(counts.values())) == 1, f"the records per job differ with its size or path: {counts}"
    assert 0 < counts[("large", "slice")] < SERIES_BOUND, counts
    # The slice holds the raw series (42 a process here: the step histogram's 21, 9 others, 3 a device), the
    # receiver none of them.
    (raw,) = tier.slice.query('count({__name__=~"jaxmon_.+"})')
    assert float(raw["value"][1]) == (len(LE) + 2 + 9 + 3 * DEVICES) * sum(JOBS.values()), raw
    assert receiver.query('count({__name__=~".+", __name__!~"jaxmon:fleet_.+"})') == []
    # No record names a process or a device but the straggler's.
    named = receiver.query(
        'count by (__name__) ({__name__=~"jaxmon:fleet_.+", __name__!="jaxmon:fleet_straggler:firing", '
        'process_index=~".+"} or {__name__=~"jaxmon:fleet_.+", device=~".+"} or {__name__=~"jaxmon:fleet_.+", '
        'instance=~".+", __name__!="jaxmon:fleet_straggler:firing"})'
    )
    assert named == [], named


def test_the_records_carry_the_jobs_figures(tier: Tier) -> None:
    receiver = tier.receiver

    def value(expr: str) -> dict[tuple[str, str], float]:
        return {(r["metric"]["workload"], r["metric"]["via"]): float(r["value"][1]) for r in receiver.query(expr)}

    receiver.wait_for("jaxmon:fleet_tokens_per_second:rate1m", lambda r: len(r) == 4, "tokens per second", 60)
    every = {(job, via) for job in JOBS for via in PATHS}
    assert value("jaxmon:fleet_processes:count") == {(job, via): JOBS[job] for job, via in every}
    assert value("jaxmon:fleet_devices:count") == {(job, via): DEVICES * JOBS[job] for job, via in every}
    for key, tokens in value("jaxmon:fleet_tokens_per_second:rate1m").items():
        assert tokens == pytest.approx(TOKENS_PER_SECOND, rel=0.05), key  # each render a little after its scrape
    # Each process's productive and badput seconds are 0.9 and 0.1 of the same render's uptime: over any one set of
    # samples the ratio is 0.9 to rounding, however the scrapes' timing moves the increases, so long as the goodput
    # rule divides figures of one set (a denominator read from a record a rule earlier, over fewer scrapes, read 0.92
    # to 0.93 at a load of 8 here).
    for key, goodput in value("jaxmon:fleet_goodput_ratio:rate5m").items():
        assert goodput == pytest.approx(0.9, rel=1e-9), key
    for key, p50 in value('jaxmon:fleet_step_seconds:quantile5m{quantile="0.5"}').items():
        assert 0.05 < p50 <= STEP, key  # every step in the 0.1 s bucket
    for key, gap in value("jaxmon:fleet_collective_wait_gap:max1h").items():
        assert gap == pytest.approx(0.36, abs=0.02), key  # process 3 waits 0.05 where the median waits ~0.41
    stragglers = receiver.query("jaxmon:fleet_straggler:firing")
    assert {(s["metric"]["workload"], s["metric"]["alertname"], s["metric"]["process_index"]) for s in stragglers} == {
        (job, "JaxmonTrainingComputeStraggler", str(STRAGGLER)) for job in JOBS
    }
