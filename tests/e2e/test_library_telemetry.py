"""Orbax's and Grain's own Prometheus telemetry beside the embedded exporter, with the real libraries: with
ENABLE_ORBAX_PROMETHEUS_TELEMETRY=true and ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true each sets PROMETHEUS_MULTIPROC_DIR
at import (when unset) and starts an HTTP server of its own. Whichever is imported first, jaxmon's port serves the
whole default registry: jaxmon's families, Grain's five and Orbax's, each once, with a real save and a real
pipeline's reads counted. The libraries' servers serve only what prometheus_client keeps in that directory: all of
Grain's and Orbax's families when Orbax set it before prometheus_client's first import, nothing at all when
prometheus_client was imported first (jaxmon before them, or Grain first). docs/training.md says which to scrape."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, parse_samples
from tests.helpers import Child, free_port

SCRIPT = ROOT / "tests" / "workloads" / "telemetry.py"
TELEMETRY = {"ENABLE_ORBAX_PROMETHEUS_TELEMETRY": "true", "ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY": "true"}
# Grain's server port: Grain 0.2.18's SetupTelemetry passes 9431 itself (PYGRAIN_PROMETHEUS_PORT is read only when
# no port is given), so a test cannot move it; Orbax's is ORBAX_PROMETHEUS_PORT.
GRAIN_PORT = 9431
# Grain's two families that have no sample until a data source of Grain's own reads (a MapDataset.range has none),
# as their HELP and TYPE lines name them in the text format.
GRAIN_UNSAMPLED = {
    "grain_python_data_sources_bytes_read_total": "counter",
    "grain_python_dataset_source_read_time_ns": "histogram",
}


def families(text: str) -> list[str]:
    """The name of every `# TYPE` line, in order (a name twice is a duplicate family)."""
    return re.findall(r"^# TYPE (\S+) ", text, flags=re.M)


def total(text: str, name: str) -> float:
    """The sum of a series over all its label sets (Orbax labels its histograms with the storage it wrote to)."""
    return sum(v for (n, _), v in parse_samples(text).items() if n == name)


@pytest.mark.parametrize("order", ["libraries-first", "jaxmon-first"])
def test_jaxmons_port_serves_orbax_and_grain_beside_their_own_servers(
    order: str, children: list[Child], tmp_path: Path
) -> None:
    orbax_port = free_port()
    child = Child(
        tmp_path, order, str(tmp_path), script=SCRIPT, env={**TELEMETRY, "ORBAX_PROMETHEUS_PORT": str(orbax_port)}
    )
    children.append(child)
    hello = child.hello
    assert hello["read"] == [0, 16, 32, 48, 64]
    # Both libraries set the directory at import; only Orbax sets it before importing prometheus_client, so its
    # values are mmap-backed only when Orbax came first.
    assert hello["multiproc_dir"] and hello["multiproc_dir"].startswith(tempfile.gettempdir())
    assert hello["value_class"] == ("MmapedValue" if order == "libraries-first" else "MutexValue")

    text = requests.get(hello["url"] + "/metrics", timeout=10).text
    names = families(text)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    # jaxmon's own, the process's (once: jaxmon's), Grain's next() calls and Orbax's one save.
    assert "jaxmon_build_info" in names and names.count("process_cpu_seconds_total") == 1
    assert total(text, "grain_python_dataset_next_duration_ns_count") == 5
    assert total(text, "jax_orbax_write_total_duration_secs_count") == 1
    assert total(text, "jax_orbax_write_success_total") == 1

    # Orbax's own server, on the port given: what prometheus_client keeps in PROMETHEUS_MULTIPROC_DIR.
    assert orbax_port in hello["ports"], hello["ports"]
    own = requests.get(f"http://127.0.0.1:{orbax_port}/metrics", timeout=10).text
    if order == "libraries-first":
        assert total(own, "grain_python_dataset_next_duration_ns_count") == 5
        assert total(own, "jax_orbax_write_total_duration_secs_count") == 1
        assert not [n for n in families(own) if n.startswith(("jaxmon_", "process_", "python_"))]
    else:
        assert families(own) == [], own[:500]
    # Grain's, on 9431 when this process got it (another process may hold it: Grain then logs and serves nothing).
    if GRAIN_PORT in hello["ports"]:
        grains = requests.get(f"http://127.0.0.1:{GRAIN_PORT}/metrics", timeout=10).text
        assert sorted(families(grains)) == sorted(families(own))
    # Last, as it needs the exposition that serves the registry as it is: Grain's families with no sample yet are
    # served too, as generate_latest serves them: HELP and TYPE (a counter's with `_total`, in this text format).
    for name, kind in GRAIN_UNSAMPLED.items():
        assert re.search(rf"^# HELP {name} \S", text, flags=re.M), name
        assert f"# TYPE {name} {kind}\n" in text, name
    assert child.send("exit") == {"stopped": True}
