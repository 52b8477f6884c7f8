"""docs/metrics.md is generated from the metric catalog (`python -m jaxmon.families.reference`): every family once,
under the collector that renders it first, with what the catalog says of it, and what jaxmon serves is what the
catalog says (its HELP and type in the golden expositions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxmon.catalog import metrics
from jaxmon.families import reference
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "golden"


def test_the_committed_reference_is_what_the_command_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regenerate with `python -m jaxmon.families.reference` after changing the catalog."""
    assert reference.PATH == ROOT / "docs" / "metrics.md"
    assert reference.PATH.read_text(encoding="utf-8") == reference.render(), (
        "docs/metrics.md is out of date: run python -m jaxmon.families.reference"
    )
    assert reference.main(["--check"]) == 0
    stale = tmp_path / "metrics.md"
    stale.write_text(reference.render().replace("| gauge |", "| counter |", 1))
    assert reference.main(["--check", "--output", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert reference.main(["--output", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == reference.render()


def test_every_family_of_the_catalog_is_in_the_reference_once_in_catalog_order() -> None:
    listed = [f for s in reference.sections() for f in s.families]
    assert sorted(listed, key=lambda f: f.name) == sorted(metrics.FAMILIES, key=lambda f: f.name)
    assert [s.collector for s in reference.sections()] == list(reference.RUNS)  # every section has families
    text = reference.render()
    for f in metrics.FAMILIES:
        assert text.count(f"| `{f.exposed}` |") == 1, f.name


def test_a_row_says_what_the_catalog_says() -> None:
    """Labels: those of every series, then those of some with when; a histogram's `le`; the zeros' keys."""
    assert reference.labels_text(metrics.DEVICE_UP) == (
        "device, platform (+ workload: embedded; + pod, namespace, container)"
    )
    assert reference.labels_text(metrics.EXPORTER_STOPPING) == "—"
    assert reference.labels_text(metrics.TRAINING_STEP_DURATION_SECONDS).startswith(
        "workload, process_index, host (+ le"
    )
    assert reference.zeros_text(metrics.TRAINING_PROFILES) == "result: taken, busy, failed, skipped"
    assert reference.zeros_text(metrics.TRAINING_STEPS) == "yes"
    assert reference.zeros_text(metrics.DEVICE_UP) == "—"
    (row,) = [line for line in reference.render().splitlines() if line.startswith("| `jaxmon_device_up` |")]
    assert "| embedded, sidecar |" in row and metrics.DEVICE_UP.help in row
    # The prose's names and keys are the catalog's.
    prose = " ".join(reference.header().split())
    assert "each built-in badput kind (startup, compile, checkpoint, restore, host, restart, stall)" in prose
    assert "`jaxmon_training_steps_created`" in prose


def _golden(path: Path) -> dict[str, tuple[str, str]]:
    """name -> (HELP, TYPE) of a golden exposition."""
    helps, types = {}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# HELP jaxmon_"):
            name, _, text = line[len("# HELP ") :].partition(" ")
            helps[name] = text.replace("\\n", "\n").replace("\\\\", "\\")
        elif line.startswith("# TYPE jaxmon_"):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            types[name] = kind
    # A counter's HELP and TYPE lines carry its samples' name (`_total`).
    return {
        name.removesuffix("_total") if kind == "counter" else name: (helps[name], kind) for name, kind in types.items()
    }


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.prom")), ids=lambda p: p.name)
def test_the_help_and_type_jaxmon_serves_are_the_catalogs(golden: Path) -> None:
    """The golden expositions (CPU devices with the probe, embedded with training, a replay, the spool) hold what
    the collectors render: each family's HELP and type is the catalog's."""
    served = _golden(golden)
    assert served
    for name, (help_text, kind) in served.items():
        assert name in metrics.BY_NAME, f"{golden.name}: {name} is not in the catalog"
        assert (metrics.BY_NAME[name].help, metrics.BY_NAME[name].type) == (help_text, kind), name
