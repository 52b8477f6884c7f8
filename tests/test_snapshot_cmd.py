"""`jaxmon snapshot`: one poll and one probe, as a table or JSON (cli.main in-process, on real JAX CPU devices)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import CLI, FIXTURES

GiB = 1 << 30


@pytest.fixture
def restore_environ() -> Iterator[None]:
    """Put os.environ back: a local source sets the sidecar's GPU variables, which later daemons would inherit."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_snapshot_json_of_a_replay_holds_the_derived_numbers(cli: CLI) -> None:
    code, out, err = cli("snapshot", "--replay", str(FIXTURES / "shapes.json"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    devices = {(d["platform"], d["id"]): d for d in doc["devices"]}
    assert devices[("gpu", 1)]["memory"]["fragmentation_ratio"] == 0.5
    assert devices[("gpu", 1)]["memory"]["largest_allocatable_bytes"] == 58 * GiB
    assert devices[("gpu", 6)]["memory_error"] == "ReplayedDeviceError: XlaRuntimeError: INTERNAL: device lost"
    assert devices[("cpu", 5)]["memory"]["supported"] is False
    assert devices[("gpu", 0)]["probe"] is None  # replayed devices run no probe
    assert doc["source"] == "replay"


@pytest.mark.usefixtures("restore_environ")
def test_snapshot_table_probes_every_cpu_device(cli: CLI) -> None:
    code, out, err = cli("snapshot", "--probe.size", "64")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["device", "kind"]
    rows = [line.split() for line in lines[1:] if line.startswith("cpu:")]
    assert [r[0] for r in rows] == [f"cpu:{i}" for i in range(8)]
    for r in rows:
        assert r[2] == "unsupported"  # CPU devices have no allocator stats
        assert r[-1] == "yes"  # the probe answered
        assert float(r[-4]) > 0  # probe ms
        assert 0.0 <= float(r[-2]) <= 1.0  # utilization
