"""Golden expositions of the three ways to run: CPU devices with the probe, the spool sidecar with two publishers,
and embedded. Values that change from run to run (times, durations, probe latencies, versions, pids) are replaced
by `X`, as node_exporter's end-to-end test strips its unstable series; names, label sets, HELP, TYPE and the stable
values are pinned. Rewrite with JAXMON_UPDATE_GOLDEN=1 when a change is intended.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, StartDaemon, promtool, sample
from tests.helpers import Child, wait_for_fresh_samples, wait_for_samples

GOLDEN = ROOT / "tests" / "golden"

# Series whose values are not reproducible; their label sets still are.
_UNSTABLE_VALUE = re.compile(
    r"^(jaxmon_probe_\w+|jaxmon_device_utilization_ratio|jaxmon_collector_duration_seconds"
    r"|jaxmon_collector_last_success_timestamp_seconds|jaxmon_workload_last_report_timestamp_seconds"
    r"|jaxmon_jit_\w+|jaxmon_compilation_cache_\w+|jaxmon_training_start_time_seconds)\b"
)
# Label values that are not reproducible.
_UNSTABLE_LABEL = re.compile(r'\b(pid|host|version|jax_version|jaxlib_version|python_version)="[^"]*"')
# Families that are not jaxmon's (process_*, python_*): checked by their own tests.
_FOREIGN = re.compile(r"^(# (HELP|TYPE) )?(process|python)_")


def normalize(text: str) -> str:
    """The reproducible part of an exposition."""
    out = []
    for line in text.splitlines():
        if _FOREIGN.match(line):
            continue
        if not line.startswith("#"):
            line = _UNSTABLE_LABEL.sub(lambda m: f'{m.group(1)}="X"', line)
            if _UNSTABLE_VALUE.match(line):
                line = line.rsplit(" ", 1)[0] + " X"
        out.append(line)
    return "\n".join(out) + "\n"


def check_golden(text: str, name: str) -> None:
    """promtool-clean, and equal to the golden file `name` once normalized."""
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    path = GOLDEN / name
    stable = normalize(text)
    if os.environ.get("JAXMON_UPDATE_GOLDEN") == "1":
        path.write_text(stable)
    assert stable == path.read_text(), f"{name} changed; rerun with JAXMON_UPDATE_GOLDEN=1 if intended"


def check_openmetrics(url: str, text: str) -> None:
    """The same exporter in OpenMetrics (as Prometheus asks for it): client_python's strict parser reads it, with the
    text format's families (and `_created` on the training counters alone: tests/e2e/test_training.py)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    r = requests.get(url + "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}, timeout=10)
    assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0"), r.headers
    names = {f.name for f in openmetrics_families(r.text)}  # type: ignore[no-untyped-call]
    assert names == {f.name for f in text_string_to_metric_families(text)}
    assert {n for n in names if n.endswith("_created")} == set()  # `_created` are samples of their counters


def test_cpu_devices_with_the_probe_match_the_golden_file(start_daemon: StartDaemon) -> None:
    d = start_daemon("--collector.probe.interval", "2s", "--poll.interval", "0.5s")
    d.wait_for(
        lambda s: (
            all(sample(s, "jaxmon_device_up", device=str(i), platform="cpu") == 1.0 for i in range(8))
            and sample(s, "jaxmon_collector_success", collector="probe") == 1.0
        ),
        what="every CPU device probed",
    )
    text = d.get("/metrics").text
    check_golden(text, "cpu_probe.prom")
    check_openmetrics(d.url, text)


def test_the_spool_sidecar_with_two_publishers_matches_the_golden_file(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    pubs = [
        Child(tmp_path, "publish", "--spool", str(spool), "--workload", name, "--interval", "0.3")
        for name in ("alpha", "beta")
    ]
    try:
        pubs[0].send("alloc 1 1048576")
        pubs[1].send("alloc 2 2097152")
        d = start_daemon("--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.3s")
        d.wait_for(
            lambda s: (
                sample(s, "jaxmon_memory_live_array_bytes", device="1", platform="cpu", workload="alpha") == 1048576.0
                and sample(s, "jaxmon_memory_live_array_bytes", device="2", platform="cpu", workload="beta")
                == 2097152.0
            ),
            what="both publishers' arrays",
        )
        text = d.get("/metrics").text
        check_golden(text, "spool.prom")
        check_openmetrics(d.url, text)
    finally:
        for p in pubs:
            p.close()


def test_the_embedded_exporter_matches_the_golden_file(tmp_path: Path) -> None:
    child = Child(tmp_path, "embedded", "--workload", "gamma", "--interval", "0.3")
    try:
        child.send("alloc 3 1048576")
        url = child.hello["url"]
        wait_for_samples(
            url,
            lambda s: (
                all(
                    sample(s, "jaxmon_device_up", device=str(i), platform="cpu", workload="gamma") == 1.0
                    for i in range(8)
                )
                and sample(s, "jaxmon_collector_success", collector="probe") == 1.0
            ),
            "every CPU device probed",
            timeout=90,
        )
        wait_for_fresh_samples(url, "memory")  # a poll that started after the array was made
        text = requests.get(url + "/metrics", timeout=10).text
        check_golden(text, "embedded.prom")
        check_openmetrics(url, text)
    finally:
        child.close()
