"""Placement through the spool (schema `jaxmon.spool/3`), in this process on the 8 real JAX CPU devices: a publisher
holding a replicated array and a pinned_host one writes each device's replicated and host-memory bytes, and the
sidecar's spool collector renders them with the workload label, as jaxmon_memory_live_array_bytes. A sidecar still
reads `/1` and `/2` documents (no such series); a newer document is a `schema_version` rejection, as an older sidecar
gives a `/3` file. The whole stack (real processes, a real Prometheus) is tests/e2e/test_prometheus.py."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PromCollector

import jaxmon
from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.spool import SpoolCollector, SpoolOptions
from jaxmon.snapshot import Snapshot
from jaxmon.sources import spool_document
from jaxmon.sources.replay import ReplaySource
from jaxmon.sources.spool_document import SCHEMAS, Rejected, read_document
from tests.conftest import FIXTURES, Samples, parse_samples
from tests.helpers import wait_until
from tests.spool_files import GOOD, doc, write

pytestmark = pytest.mark.usefixtures("no_jaxmon_env", "restore_logging")

F32 = 4
PartitionSpec: Any = jax.sharding.PartitionSpec  # untyped to mypy
Figures = dict[str, dict[str, float]]  # family (a host memory kind for the host family) -> device -> bytes


class _Families(PromCollector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from (f for f in self.families if f.samples)


def sidecar_samples(spool: Path) -> Samples:
    """One poll of a sidecar's spool collector over `spool`, rendered and read back."""
    collector = SpoolCollector(
        SpoolOptions(dir=spool, ttl=3600.0), standalone_context(ReplaySource(FIXTURES / "shapes.json"))
    )
    try:
        update = collector.update()
        assert update.success
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(list(collector.families(Snapshot(), update.state))))
        return parse_samples(generate_latest(registry).decode())
    finally:
        collector.stop()


def placement(samples: Samples, workload: str) -> Figures:
    """The replicated and host-memory bytes of `workload`'s devices in `samples`."""
    out: Figures = {}
    for (name, labels), value in samples.items():
        lab = dict(labels)
        if name == "jaxmon_memory_replicated_array_bytes":
            key = "replicated"
        elif name == "jaxmon_memory_host_array_bytes":
            key = lab.pop("memory_kind")
        else:
            continue
        assert lab.pop("workload") == workload and lab.pop("platform") == "cpu", labels
        out.setdefault(key, {})[lab.pop("device")] = value
        assert not lab, labels
    return out


def test_the_publisher_carries_replicated_and_host_bytes_to_the_sidecar(tmp_path: Path) -> None:
    # One document at start, the second at stop(remove=False), after the arrays below are made.
    gc.collect()  # other tests' dead arrays go now, not between the two documents
    publisher = jaxmon.publish(tmp_path, workload="placed", interval=3600.0)
    kept: list[Any] = []
    try:
        wait_until(lambda: publisher.writes == 1, what="the first document")
        before = placement(sidecar_samples(tmp_path), "placed")
        assert set(before) == {"replicated", "pinned_host", "unpinned_host"}
        assert all(len(per) == 8 for per in before.values())  # every device, 0 where none
        mesh = Mesh(np.array(jax.devices()), ("d",))
        kept.append(jax.device_put(np.ones(3000, np.float32), NamedSharding(mesh, PartitionSpec())))
        pinned = NamedSharding(mesh, PartitionSpec("d"), memory_kind="pinned_host")
        kept.append(jax.device_put(np.ones(8 * 500, np.float32), pinned))
        unpinned = jax.sharding.SingleDeviceSharding(jax.devices()[5], memory_kind="unpinned_host")
        kept.append(jax.device_put(np.ones(700, np.float32), unpinned))
    finally:
        publisher.stop(remove=False)
    assert publisher.writes == 2
    written = json.loads(publisher.path.read_text())
    assert written["schema"] == "jaxmon.spool/3"
    after = placement(sidecar_samples(tmp_path), "placed")
    grown = {k: {d: v - before[k][d] for d, v in per.items()} for k, per in after.items()}
    devices = [str(d.id) for d in jax.devices()]
    assert grown == {
        "replicated": dict.fromkeys(devices, 3000.0 * F32),  # the whole array on each device
        "pinned_host": dict.fromkeys(devices, 500.0 * F32),  # an eighth on each
        "unpinned_host": {d: 700.0 * F32 if d == "5" else 0.0 for d in devices},
    }
    # The document holds what the sidecar rendered.
    for entry in written["devices"]:
        assert entry["replicated_array_bytes"] == after["replicated"][str(entry["id"])]
        assert entry["host_array_bytes"] == {k: after[k][str(entry["id"])] for k in ("pinned_host", "unpinned_host")}


def _schema_2() -> dict[str, Any]:
    """The fixture document as a schema-2 publisher writes it (a device's num_cores; no placement)."""
    devices = [{**d, "num_cores": 1} for d in GOOD["devices"]]
    return doc("two", schema="jaxmon.spool/2", devices=devices)


def _schema_3() -> dict[str, Any]:
    placed = {"replicated_array_bytes": 4096, "host_array_bytes": {"pinned_host": 512, "unpinned_host": 0}}
    return doc("three", schema="jaxmon.spool/3", devices=[{**d, "num_cores": 1, **placed} for d in GOOD["devices"]])


def test_the_sidecar_reads_schemas_1_2_and_3_and_only_3_has_placement(tmp_path: Path) -> None:
    assert SCHEMAS == ("jaxmon.spool/1", "jaxmon.spool/2", "jaxmon.spool/3")
    write(tmp_path / "one.h.1.json", doc("one"))  # the fixture is a schema-1 document
    write(tmp_path / "two.h.2.json", _schema_2())
    write(tmp_path / "three.h.3.json", _schema_3())
    s = sidecar_samples(tmp_path)
    gpu = {"device": "0", "platform": "gpu"}
    for workload in ("one", "two", "three"):  # every document read
        assert s[("jaxmon_memory_bytes_in_use", frozenset({**gpu, "workload": workload}.items()))] == 1610612736
    placed = {
        k: v for k, v in s.items() if k[0] in ("jaxmon_memory_replicated_array_bytes", "jaxmon_memory_host_array_bytes")
    }
    three = {**gpu, "workload": "three"}
    assert placed == {
        ("jaxmon_memory_replicated_array_bytes", frozenset(three.items())): 4096.0,
        ("jaxmon_memory_host_array_bytes", frozenset({**three, "memory_kind": "pinned_host"}.items())): 512.0,
        ("jaxmon_memory_host_array_bytes", frozenset({**three, "memory_kind": "unpinned_host"}.items())): 0.0,
    }
    assert s[("jaxmon_spool_rejected_files_total", frozenset({"reason": "schema_version"}.items()))] == 0


def test_placement_fields_are_bounded_like_every_other_field(tmp_path: Path) -> None:
    device = {**GOOD["devices"][0], "num_cores": 1}
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "negative": ({**device, "replicated_array_bytes": -1}, "replicated_array_bytes"),
        "huge": ({**device, "replicated_array_bytes": 2**63}, "replicated_array_bytes"),
        "many_kinds": ({**device, "host_array_bytes": {f"k{n}": 1 for n in range(9)}}, "host_array_bytes"),
        "empty_kind": ({**device, "host_array_bytes": {"": 1}}, "host_array_bytes"),
        "float_bytes": ({**device, "host_array_bytes": {"pinned_host": 1.5}}, "host_array_bytes"),
    }
    for name, (dev, where) in cases.items():
        path = tmp_path / f"{name}.json"
        write(path, doc(name, schema="jaxmon.spool/3", devices=[dev]))
        with pytest.raises(Rejected) as exc:
            read_document(path, 1 << 20)
        assert exc.value.reason == "bad_schema", name
        assert f"devices.0.{where}" in str(exc.value), (name, str(exc.value))


def test_a_newer_schema_is_a_schema_version_rejection_naming_what_this_sidecar_reads(tmp_path: Path) -> None:
    path = tmp_path / "four.h.4.json"
    write(path, {**_schema_3(), "schema": "jaxmon.spool/4"})
    with pytest.raises(Rejected) as exc:
        read_document(path, 1 << 20)
    assert exc.value.reason == "schema_version"
    assert "'jaxmon.spool/1' or 'jaxmon.spool/2' or 'jaxmon.spool/3'" in str(exc.value)


def test_an_older_sidecar_rejects_what_a_publisher_writes_now_as_schema_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/modes.md: a sidecar older than its trainers rejects their files with reason schema_version (upgrade the
    sidecar first). A sidecar of schema 2 reads "jaxmon.spool/1" and "jaxmon.spool/2"."""
    publisher = jaxmon.publish(tmp_path, workload="newer", interval=3600.0)
    publisher.stop(remove=False)
    assert publisher.writes >= 1
    assert read_document(publisher.path, 1 << 20).devices  # this sidecar reads it
    monkeypatch.setattr(spool_document, "SCHEMAS", ("jaxmon.spool/1", "jaxmon.spool/2"))
    with pytest.raises(Rejected) as exc:
        read_document(publisher.path, 1 << 20)
    assert exc.value.reason == "schema_version"
    assert "'jaxmon.spool/3'" in str(exc.value)
