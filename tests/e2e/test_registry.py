"""The embedded exporter also serves prometheus_client's default registry: a real grain pipeline (grain registers
its families there at import) and a Counter of the loop's own, in a child process under jaxmon.start(), scraped
over HTTP. Each family once (jaxmon's own process_* and python_* win over the registry's), fresh at each scrape,
parsed by prometheus_client and clean for promtool; off with --collector.default_registry=false."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import requests

from tests.conftest import ROOT, parse_samples, promtool, sample
from tests.helpers import Child, wait_for_samples

SCRIPT = ROOT / "tests" / "workloads" / "registry.py"
# What grain 0.2 registers at import (grain/_src/core/prometheus_monitoring.py, _PROMETHEUS_ALLOWED_METRICS).
GRAIN = (
    "grain_python_dataset_next_duration_ns",
    "grain_python_dataset_prefetch_buffer_ready_count",
    "grain_python_data_sources_bytes_read",
    "grain_python_dataset_source_read_time_ns",
    "grain_python_data_loader_iterator_get_next",
)


def families(text: str) -> list[str]:
    """The name of every `# TYPE` line, in order (a name twice is a duplicate family)."""
    return re.findall(r"^# TYPE (\S+) ", text, flags=re.M)


def lint(text: str) -> None:
    """promtool parses it (a family twice is a parse error, exit 1) and finds nothing to say about any name but
    grain's own: it names a histogram `..._duration_ns` ("metric names should not contain abbreviated units", exit
    3), which is grain's choice to make, not the exporter's."""
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    problems = [line for line in (check.stdout + check.stderr).splitlines() if line.strip()]
    assert check.returncode in (0, 3) and "error while linting" not in check.stderr, problems
    assert all(p.startswith("grain_python_dataset_next_duration_ns") for p in problems), problems


def test_grain_and_the_loops_own_metrics_are_served_once_and_fresh(children: list[Child], tmp_path: Path) -> None:
    child = Child(tmp_path, script=SCRIPT)
    children.append(child)
    url = child.hello["url"]
    assert child.send("batches 50") == {"read": 50}
    text = requests.get(url + "/metrics", timeout=10).text
    names = families(text)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    lint(text)
    s = parse_samples(text)
    # The loop's own Counter, and grain's histogram of next() calls: one per batch the loop read.
    assert sample(s, "trainer_batches_total", split="train") == 50
    assert sample(s, "grain_python_dataset_next_duration_ns_count") == 50
    # Its families, all five: its two labelled ones have no sample until a source of its own reads, and are served
    # all the same, HELP and TYPE, as generate_latest serves them.
    served = {n.removesuffix("_created").removesuffix("_total") for n in names if n.startswith("grain_")}
    assert served == set(GRAIN), served
    # jaxmon's own families and its process_* families, each once (the registry's copies are left out).
    assert names.count("process_cpu_seconds_total") == 1 and names.count("python_info") == 1
    assert "jaxmon_build_info" in names
    # Read at each scrape, not on a poll: the next scrape at once has the batches read since.
    assert child.send("batches 7") == {"read": 57}
    s = parse_samples(requests.get(url + "/metrics", timeout=10).text)
    assert sample(s, "trainer_batches_total", split="train") == 57
    assert sample(s, "grain_python_dataset_next_duration_ns_count") == 57
    # gzip (process part its own member) and collect[] read the same.
    zipped = requests.get(url + "/metrics", headers={"accept-encoding": "gzip"}, timeout=10)
    assert zipped.headers.get("content-encoding") == "gzip"
    assert sample(parse_samples(zipped.text), "trainer_batches_total", split="train") == 57
    only = requests.get(url + "/metrics", params={"collect[]": "default_registry"}, timeout=10).text
    assert sample(parse_samples(only), "trainer_batches_total", split="train") == 57 and "jaxmon_build_info" not in only
    assert child.send("exit") == {"stopped": True}


def test_the_default_registry_can_be_turned_off(children: list[Child], tmp_path: Path) -> None:
    child = Child(tmp_path, script=SCRIPT, env={"JAXMON_COLLECTOR__DEFAULT_REGISTRY": "false"})
    children.append(child)
    url = child.hello["url"]
    child.send("batches 5")
    s = wait_for_samples(url, lambda s: sample(s, "jaxmon_collector_success", collector="memory") is not None)
    assert not [k for k in s if k[0].startswith(("grain_", "trainer_"))]
    assert sample(s, "jaxmon_collector_success", collector="default_registry") is None
    assert sample(s, "process_cpu_seconds_total") is not None  # jaxmon's own process families stay
