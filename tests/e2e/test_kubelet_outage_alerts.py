"""A kubelet outage of 60 s under a node jaxmon pages nothing: every alert of alerts.yml and job.yml, under promtool.

The series are a real node jaxmon's (node mode, the fake NVML's two GPUs, the fake kubelet of tests/fake_kubelet.py
saying which pod holds each), scraped twice: with the kubelet answering (every GPU series carries its pod), and
after the kubelet went away for longer than --collector.kubernetes.ttl (no pod labels, the kubernetes collector
failing). promtool replays them as Prometheus would have scraped them every 15 s for 25 minutes: the labelled
series, then from 14m45s the unlabelled ones for 60 s (the labelled marked stale, as Prometheus marks a series a
scrape no longer has), then the labelled ones again. Beside them, the trainers of the pods (their
jaxmon_workload_info with namespace and pod, as the Downward API gives them; their steps), so the job rules join
the GPUs to their workload. Every alert of both files, the shipped ones unchanged, evaluated every 15 s, must stay
quiet from before the outage to five minutes after it. test_job_view.py runs a real Prometheus through an outage of
the real kubelet fake; this is every alert, at the shipped `for:`, in seconds.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Samples, StartDaemon, promtool, sample
from tests.deploy_files import JOB_RULES, RULES, alert_rules
from tests.fake_kubelet import FakeKubelet, container, pod
from tests.fakenvml import Scenario, device

GPUS = 2
NAMESPACE = "ml"
INSTANCE = "gpu-node:10401"
STEP = 15  # seconds between scrapes
SAMPLES = 100  # 25 minutes
OUTAGE = (59, 63)  # the unlabelled scrapes: 14m45s to 15m30s, 60 s without pod labels
# Every alert, pending or firing, but the one the outage is about.
QUIET = 'ALERTS unless on (alertname, collector) ALERTS{alertname="JaxmonCollectorFailing", collector="kubernetes"}'
EVAL_TIMES = [f"{s}s" for s in range(13 * 60, 20 * 60 + 1, STEP)]


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet()
    yield fake
    fake.close()


def _scrapes(start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet) -> tuple[Samples, Samples]:
    """The node jaxmon's series with the kubelet answering, and once its labels have gone."""
    # GPU 1 has counted uncorrected ECC errors (long ago), and GPU 0 gets an Xid 79 below: counters whose
    # first-appearance branches must not take a series that only lost or regained its pod for a new error.
    gpus = [device(0), device(1, ecc={"enabled": True, "corrected": 1, "uncorrected": 2})]
    # Pod llama-i holds GPU i.
    held = [container("trainer", {"nvidia.com/gpu": [gpu["uuid"]]}) for gpu in gpus]
    kubelet.update(pods=[pod(NAMESPACE, f"llama-{i}", c) for i, c in enumerate(held)])
    kubelet.start()
    nvml = Scenario(tmp_path / "nvml.json", gpus)
    flags = ["--node", "--poll.interval", "0.3s", "--collector.nvml", "--collector.kubernetes"]
    socket = ["--collector.kubernetes.socket", str(kubelet.socket), "--collector.kubernetes.ttl", "1s"]
    d = start_daemon(*flags, *socket, env=nvml.env())

    def labelled(s: Samples) -> bool:
        return any(name == "jaxmon_device_info" and ("pod", "llama-0") in labels for name, labels in s)

    d.wait_for(lambda s: labelled(s) and sample(s, "jaxmon_collector_success", collector="nvml") == 1)
    nvml.xid(0, 79)
    before = d.wait_for(
        lambda s: labelled(s) and any(name == "jaxmon_device_xid_errors_total" for name, _ in s), what="an Xid"
    )
    kubelet.stop()
    during = d.wait_for(
        lambda s: not labelled(s) and sample(s, "jaxmon_collector_success", collector="kubernetes") == 0,
        what="the labels gone",
        timeout=20,
    )
    return before, during


def _series(name: str, labels: frozenset[tuple[str, str]]) -> str:
    extra = {"job": "jaxmon-node", "instance": INSTANCE}
    text = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted({**dict(labels), **extra}.items()))
    return f"{name}{{{text}}}"


def _values(value: float, present: set[int]) -> str:
    """`value` at the scrapes in `present`, a stale marker at the first scrape after each run of them."""
    parts = []
    for i in range(SAMPLES):
        if i in present:
            parts.append(repr(value))
        elif i - 1 in present:
            parts.append("stale")
        else:
            parts.append("_")
    return " ".join(parts)


def _input(before: Samples, during: Samples) -> list[dict[str, str]]:
    first, last = OUTAGE
    series = []
    for key in sorted(set(before) | set(during)):
        a, b = before.get(key), during.get(key)
        if any(v is not None and not math.isfinite(v) for v in (a, b)):
            continue
        if a is not None and b is not None:  # the exporter's own series: there all along
            values = " ".join(repr(b if first <= i < last else a) for i in range(SAMPLES))
        elif a is not None:  # a pod-labelled series: gone during the outage
            values = _values(a, set(range(SAMPLES)) - set(range(first, last)))
        else:
            assert b is not None
            values = _values(b, set(range(first, last)))
        series.append({"series": _series(*key), "values": values})
    series.append({"series": f'up{{job="jaxmon-node", instance="{INSTANCE}"}}', "values": f"1x{SAMPLES}"})
    for i in range(GPUS):
        trainer = f'job="jaxmon", instance="llama-{i}:10401", workload="llama", process_index="{i}"'
        series += [
            {"series": f'up{{job="jaxmon", instance="llama-{i}:10401"}}', "values": f"1x{SAMPLES}"},
            {
                "series": f'jaxmon_workload_info{{{trainer}, namespace="{NAMESPACE}", pod="llama-{i}", host="h"}}',
                "values": f"1x{SAMPLES}",
            },
            {
                "series": f'jaxmon_training_steps_total{{{trainer}, process_count="{GPUS}", host="h"}}',
                "values": f"0+30x{SAMPLES}",
            },
        ]
    return series


def test_a_60s_kubelet_outage_fires_no_alert(start_daemon: StartDaemon, tmp_path: Path, kubelet: FakeKubelet) -> None:
    before, during = _scrapes(start_daemon, tmp_path, kubelet)
    labelled = {k for k in before if ("pod", "llama-0") in k[1] and k[0].startswith("jaxmon_device_")}
    assert len(labelled) > 20, "the GPUs' series carry their pods"
    assert not [k for k in during if ("pod", "llama-0") in k[1]]
    assert {"jaxmon_device_xid_errors_total", "jaxmon_device_ecc_errors_total"} <= {k[0] for k in labelled}
    names = sorted({r["alert"] for r in alert_rules(RULES)} | {r["alert"] for r in alert_rules(JOB_RULES)})
    checks: list[dict[str, Any]] = [
        # The job view keeps the GPUs during the outage: the series lost their pods, the rules kept them.
        {
            "expr": 'count(jaxmon:gpu_workload:info{workload="llama"})',
            "eval_time": "15m15s",
            "exp_samples": [{"labels": "{}", "value": GPUS}],
        },
        {"expr": 'count(jaxmon_device_info{pod!=""})', "eval_time": "15m15s", "exp_samples": []},
        # No alert is even pending but the kubernetes collector's failure (the outage itself, far from its 10
        # minutes): an alert pending through this outage would fire through a longer one.
        *({"expr": QUIET, "eval_time": t, "exp_samples": []} for t in EVAL_TIMES),
    ]
    case: dict[str, Any] = {
        "name": "a 60 s kubelet outage",
        "interval": f"{STEP}s",
        "input_series": _input(before, during),
        "promql_expr_test": checks,
        "alert_rule_test": [
            {"eval_time": t, "alertname": name, "exp_alerts": []} for t in EVAL_TIMES for name in names
        ],
    }
    tests = {
        "rule_files": [str(RULES), str(JOB_RULES)],
        "evaluation_interval": f"{STEP}s",
        "tests": [case],
    }
    path = tmp_path / "outage_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False, width=1 << 16), encoding="utf-8")
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
