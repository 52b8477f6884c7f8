"""docs/metrics.md is generated from the code (`python -m jaxmon.families.reference`), and the code's reference is
what jaxmon serves: every family of the family tables is in it, and the HELP and type of every family the golden
expositions and the collectors render are the reference's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import jaxmon.families
from jaxmon.families import Spec, labels, reference
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "golden"


def _entries() -> dict[str, reference.Entry]:
    return {e.spec.name: e for s in reference.sections() for e in s.entries}


def test_the_committed_reference_is_what_the_command_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regenerate with `python -m jaxmon.families.reference` after changing a family."""
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


def test_every_spec_of_the_family_tables_is_in_the_reference_once() -> None:
    """A family added to jaxmon/families/*.py without its labels and source here fails (and render() names it)."""
    names = [e.spec.name for s in reference.sections() for e in s.entries]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    listed = set(names)
    package = Path(jaxmon.families.__file__).parent
    for path in sorted(package.glob("*.py")):
        module = __import__(f"jaxmon.families.{path.stem}", fromlist=["_"]) if path.stem != "__init__" else None
        if module is None or path.stem == "reference":
            continue
        source = inspect.getsource(module)
        declared = set(re.findall(r'Spec\(\s*"(jaxmon_[a-z0-9_]+)"', source))
        assert declared <= listed, f"{path.name}: {sorted(declared - listed)} not in the reference"
    assert set(labels.LABELS_AND_SOURCE) == listed  # no metadata of a family that is gone


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
def test_the_help_and_type_jaxmon_serves_are_the_references(golden: Path) -> None:
    """The golden expositions (CPU devices with the probe, embedded with training, a replay, the spool) hold what
    the collectors render: each family's HELP and type is the reference's, inline ones (INLINE) included."""
    entries = _entries()
    served = _golden(golden)
    assert served
    for name, (help_text, kind) in served.items():
        assert name in entries, f"{golden.name}: {name} is not in the reference"
        assert (entries[name].spec.help, entries[name].kind) == (help_text, kind), name


def test_the_nvml_families_rendered_are_the_references() -> None:
    """What no golden file holds: NVML's families (every reading of the nvml collector tests' full GPU, Xid and
    processes included), rendered by the collector's own code."""
    from jaxmon.collectors.nvml import NvmlState, render
    from tests.unit.collectors.test_nvml import FULL

    entries = _entries()
    families = [f for f in render(NvmlState(gpus=(FULL,), xid={(3, 79): 1}), {}) if f.samples]
    assert len(families) > 40
    for fam in families:
        assert fam.name in entries, fam.name
        assert (entries[fam.name].spec.help, entries[fam.name].kind) == (fam.documentation, fam.type), fam.name


def test_a_unit_is_read_from_the_name() -> None:
    assert reference.unit("jaxmon_device_power_watts") == "watts"
    assert reference.unit("jaxmon_device_pcie_throughput_bytes_per_second") == "bytes/s"
    assert reference.unit("jaxmon_training_last_step_timestamp_seconds") == "Unix seconds"
    assert reference.unit("jaxmon_probe_runs") == "—"
    assert isinstance(reference.INLINE["spool"][0].spec, Spec)
