"""The metric catalog (jaxmon/catalog/metrics.py) is every family jaxmon exports, as jaxmon exports it: a family or a
label the code renders and the catalog does not declare fails here (and in every end-to-end scrape:
tests/helpers.parse_samples), and each family's name is written in the catalog alone."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from jaxmon.catalog import metrics
from jaxmon.catalog.metrics import Family
from jaxmon.collectors import registry
from jaxmon.families import add
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "golden"
# The mode each golden exposition was taken in (tests/e2e/test_golden.py): a daemon on CPU devices (with the probe;
# replayed), an embedded workload, and a daemon serving two publishers' spool beside its own devices.
GOLDEN_MODES = {
    "cpu_probe.prom": (metrics.SIDECAR,),
    "replay.prom": (metrics.SIDECAR,),
    "embedded.prom": (metrics.EMBEDDED,),
    "spool.prom": (metrics.SIDECAR, metrics.PUBLISHER),
}


def _problems(families: Iterable[Metric]) -> list[str]:
    return [
        problem
        for fam in families
        if fam.name.startswith("jaxmon_")
        for problem in metrics.undeclared(fam.name, fam.type, ((s.name, s.labels) for s in fam.samples))
    ]


def test_each_entry_is_named_after_its_family_and_declared_once() -> None:
    constants = {name: value for name, value in vars(metrics).items() if isinstance(value, Family)}
    assert len(constants) == len(metrics.FAMILIES) == len(metrics.BY_NAME) > 150
    for constant, family in constants.items():
        assert family.name == "jaxmon_" + constant.lower(), constant
        assert not family.name.endswith("_total"), family.name


def test_each_entry_is_whole() -> None:
    """Its type is one of Prometheus', its modes and collectors exist, its labels are valid and said once, its zeros
    are a counter's (or the histogram's buckets), and its unit is its name's unless it says otherwise."""
    collectors = {"exposition", *registry()}
    for f in metrics.FAMILIES:
        assert f.type in metrics.SUFFIXES, f.name
        assert f.help and f.source and f.labels is not None, f.name
        assert set(f.modes) <= set(metrics.MODES) and f.modes, f.name
        assert set(f.collectors) <= collectors and f.collectors, f.name
        names = [*f.labels, *(label for e in f.extra for label in e.labels)]
        assert len(names) == len(set(names)), f"{f.name}: a label declared twice"
        assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", n) and n not in ("le", "quantile") for n in names), f.name
        assert f.zeros is None or f.type in (metrics.COUNTER, metrics.HISTOGRAM), f.name
        assert (f.type == metrics.HISTOGRAM) == bool(f.buckets), f.name
        assert list(f.buckets) == sorted(f.buckets), f.name
        if f.zeros is not None and f.zeros.label:
            assert f.zeros.label in f.labels and f.zeros.keys, f.name
    assert metrics.MEMORY_BYTES_IN_USE.unit == "bytes"  # its name ends in `_in_use`: declared
    assert metrics.DEVICE_POWER_WATTS.unit == "watts" and metrics.PROBE_RUNS.unit == "—"


def test_a_family_that_needs_jax_is_not_exported_in_node_mode() -> None:
    """Node mode runs no collector that reads this process's JAX devices: a family only such collectors render
    is not declared for it."""
    collectors = registry()
    for f in metrics.FAMILIES:
        jax_only = all(c in collectors and collectors[c].needs_jax for c in f.collectors)
        assert not (jax_only and metrics.NODE in f.modes), f.name


def test_the_check_finds_what_the_catalog_does_not_declare() -> None:
    """A check on the check: an unknown family, another type, an undeclared label, a missing one, a foreign sample
    name; and nothing on a family as declared (a histogram's `le`, a counter's `_total`, an owner label)."""
    fam = Metric("jaxmon_not_a_family", "", "gauge")
    assert metrics.undeclared(fam.name, "gauge", []) == [
        "jaxmon_not_a_family: not in the catalog (jaxmon/catalog/metrics.py)"
    ]
    up = metrics.DEVICE_UP
    assert metrics.undeclared(up.name, "counter", []) == ["jaxmon_device_up: rendered as a counter, declared a gauge"]
    assert metrics.undeclared(up.name, "gauge", [(up.name, {"device": "0", "platform": "cpu", "pod": "p"})]) == []
    (odd,) = metrics.undeclared(up.name, "gauge", [(up.name, {"device": "0", "platform": "cpu", "chip": "0"})])
    assert "['chip'] not declared" in odd
    (missing,) = metrics.undeclared(up.name, "gauge", [(up.name, {"device": "0"})])
    assert "without ['platform']" in missing
    (named,) = metrics.undeclared(up.name, "gauge", [(up.name + "_total", {"device": "0", "platform": "cpu"})])
    assert "a sample named jaxmon_device_up_total" in named
    steps = metrics.TRAINING_STEP_DURATION_SECONDS
    labels = {"workload": "w", "process_index": "0", "host": "h"}
    samples = [(steps.name + "_bucket", {**labels, "le": "+Inf"}), (steps.name + "_count", labels)]
    assert metrics.undeclared(steps.name, "histogram", samples) == []
    errors = metrics.MEMORY_READ_ERRORS
    assert metrics.undeclared(errors.name, "counter", [(errors.exposed, {"device": "0", "platform": "cpu"})]) == []


def _golden_families(path: Path) -> list[Metric]:
    # The golden files hold X where a value varies: any number parses the same.
    text = re.sub(r" X( |$)", r" 0\1", path.read_text(encoding="utf-8"), flags=re.M)
    return list(text_string_to_metric_families(text))


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.prom")), ids=lambda p: p.name)
def test_every_family_of_the_golden_expositions_is_declared_and_exported_in_that_mode(golden: Path) -> None:
    families = _golden_families(golden)
    assert len(families) > 5
    assert _problems(families) == []
    modes = GOLDEN_MODES[golden.name]
    for fam in families:
        if fam.name.startswith("jaxmon_"):
            declared = metrics.BY_NAME[fam.name].modes
            assert set(modes) & set(declared), f"{golden.name}: {fam.name} is declared for {declared} only"


def test_every_nvml_family_the_collector_renders_is_declared() -> None:
    """What no golden file holds: NVML's families (the nvml collector tests' full GPU: MIG, GPM with its pipes,
    NVLink per link and summed, Xid, processes), rendered by the collector's own code."""
    from jaxmon.collectors.nvml import NvmlState, render
    from tests.unit.collectors.test_nvml import FULL

    state = NvmlState(gpus=(FULL,), xid={(3, 79): 1})
    rendered = [*render(state, {77: "train"}), *render(state, {}, nvlink_links=True, gpm_pipes=True)]
    names = {f.name for f in rendered if f.samples}
    assert len(names) > 45
    assert _problems(rendered) == []
    assert {f.name for f in metrics.FAMILIES if "nvml" in f.collectors} <= names


def test_the_owner_labels_are_declared_wherever_the_owner_transform_may_write_them() -> None:
    """The owner transform labels every series that names a device or a pid, and every series of the host's libtpu
    (jaxmon.ownership.owners): each family whose series do declares them, but the kubelet's own, which carries them
    as its own labels."""
    owners = {"pod", "namespace", "container"}
    for f in metrics.FAMILIES:
        libtpu_host = "tpu" in f.collectors and "source" in f.labels
        if ({"device", "pid"} & set(f.labels) or libtpu_host) and f is not metrics.SLURM_JOB_DEVICE_INFO:
            assert owners <= f.label_names, f.name
    assert owners <= set(metrics.KUBERNETES_POD_DEVICE_INFO.labels)


def test_a_family_rendered_from_the_catalog_is_what_it_declares() -> None:
    fam = metrics.TRAINING_BADPUT_SECONDS.new()
    add(fam, {"workload": "w", "process_index": "0", "host": "h", "kind": "compile"}, 1.0)
    assert (fam.name, fam.type, fam.documentation) == (
        "jaxmon_training_badput_seconds",
        "counter",
        metrics.TRAINING_BADPUT_SECONDS.help,
    )
    assert fam.samples[0].name == "jaxmon_training_badput_seconds_total"
    assert _problems([fam]) == []


def named_elsewhere() -> dict[str, list[str]]:
    """Each family whose name (or a sample name of it) is written in a module of jaxmon other than the catalog: a
    whole word of the characters names are made of (each file's set of words: a regex search of every file for every
    name took seconds)."""
    catalog = ROOT / "jaxmon" / "catalog" / "metrics.py"
    words = {
        p: set(re.findall(r"[a-z0-9_]+", p.read_text(encoding="utf-8")))
        for p in (ROOT / "jaxmon").rglob("*.py")
        if p != catalog
    }
    out: dict[str, list[str]] = {}
    for f in metrics.FAMILIES:
        names = [f.name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count", "_created")]
        where = sorted(str(p.relative_to(ROOT)) for p, found in words.items() if any(n in found for n in names))
        if where:
            out[f.name] = where
    return out


def test_nine_families_in_ten_are_named_in_the_catalog_alone() -> None:
    """The rest of jaxmon reads a family through its catalog entry (`metrics.DEVICE_UP`), so that a family is
    changed in one place. Those still named elsewhere are comments of the training wing's modules."""
    elsewhere = named_elsewhere()
    assert len(elsewhere) <= len(metrics.FAMILIES) // 10, elsewhere
