"""docs/dcgm.md, the catalog's HELP and the dashboards map dcgm-exporter's DCGM field names to jaxmon's series in
both spellings of each renamed field: dcgm-exporter's up to 4.8, and the names 4.9 (DCGM 4.7's) and 4.10 (PCIe and
NVLink traffic) list instead."""

from __future__ import annotations

import json
import re

import pytest

from jaxmon.catalog import metrics
from jaxmon.sources.nvml.readings import GPM_METRICS
from tests.helpers import ROOT

# The old spelling -> (the renamed one, the field id, the jaxmon series): DCGM's dcgmlib/dcgm_fields.h (v4.6.0, its
# "Deprecated: renamed per DCGM Field Naming Standard" aliases), dcgm-exporter 4.9.0's and 4.10.0's release notes.
RENAMED = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        1001,
        metrics.DEVICE_GRAPHICS_ENGINE_ACTIVE_RATIO,
    ),
    "DCGM_FI_PROF_SM_ACTIVE": ("DCGM_FI_PROF_SM_UTIL_RATIO", 1002, metrics.DEVICE_SM_ACTIVE_RATIO),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", 1003, metrics.DEVICE_SM_OCCUPANCY_RATIO),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1004, metrics.DEVICE_TENSOR_ACTIVE_RATIO),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1005, metrics.DEVICE_DRAM_ACTIVE_RATIO),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("DCGM_FI_PROF_FP64_UTIL_RATIO", 1006, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("DCGM_FI_PROF_FP32_UTIL_RATIO", 1007, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("DCGM_FI_PROF_FP16_UTIL_RATIO", 1008, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", 1009, None),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", 1010, None),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND", 1011, None),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND", 1012, None),
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": ("DCGM_FI_PROF_IMMA_UTIL_RATIO", 1013, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ("DCGM_FI_PROF_HMMA_UTIL_RATIO", 1014, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": ("DCGM_FI_PROF_DFMA_UTIL_RATIO", 1015, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": ("DCGM_FI_PROF_INT_UTIL_RATIO", 1016, metrics.DEVICE_PIPE_ACTIVE_RATIO),
    "DCGM_FI_PROF_NVDEC0_ACTIVE": ("DCGM_FI_PROF_NVDEC_UTIL_0_RATIO", 1017, None),
    "DCGM_FI_PROF_NVJPG0_ACTIVE": ("DCGM_FI_PROF_NVJPG_UTIL_0_RATIO", 1025, None),
    "DCGM_FI_PROF_NVOFA0_ACTIVE": ("DCGM_FI_PROF_NVOFA_UTIL_0_RATIO", 1033, None),
}
DOC = ROOT / "docs" / "dcgm.md"


def _rows() -> list[list[str]]:
    """The field table's rows, as cells."""
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `DCGM_FI_PROF_")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def _names(cell: str) -> list[str]:
    return re.findall(r"`(DCGM_FI_[A-Z0-9_]+)`", cell)


def test_the_doc_maps_each_renamed_field_in_both_spellings_beside_its_id_and_series() -> None:
    by_old = {_names(row[0])[0]: row for row in _rows()}
    for old, (new, field_id, family) in RENAMED.items():
        row = by_old[old]
        assert _names(row[1])[0] == new, row
        assert row[2].split("–")[0] == str(field_id), row
        if family is not None:
            assert f"`{family.exposed}" in row[3], row


def test_the_fields_not_renamed_say_so_and_every_row_has_two_spelling_columns() -> None:
    rows = _rows()
    assert len(rows) == 22 and all(len(row) == 5 for row in rows)
    unrenamed = [row for row in rows if row[1] == "—"]
    assert [_names(row[0])[0] for row in unrenamed] == [
        "DCGM_FI_PROF_NVLINK_L0_TX_BYTES",
        "DCGM_FI_PROF_C2C_TX_ALL_BYTES",
        "DCGM_FI_PROF_HOSTMEM_CACHE_HIT",
    ]


def test_every_gpm_metric_jaxmon_reads_has_both_dcgm_spellings_in_its_row() -> None:
    """readings.GPM_METRICS is what the nvml collector asks NVML for; each is one row of the doc, by its GPM id."""
    for gpm_id, name in GPM_METRICS.items():
        (row,) = [row for row in _rows() if f"`{name}` ({gpm_id})" in row[4]]
        old, new = _names(row[0])[0], _names(row[1])[0]
        assert RENAMED[old][0] == new


@pytest.mark.parametrize("old", [old for old, (_, _, family) in RENAMED.items() if family is not None])
def test_the_help_of_each_gpm_family_names_both_spellings(old: str) -> None:
    new, _, family = RENAMED[old]
    assert family is not None
    if family is metrics.DEVICE_PIPE_ACTIVE_RATIO:  # one family for seven fields: both patterns
        assert "DCGM_FI_PROF_PIPE_*_ACTIVE" in family.help and "DCGM_FI_PROF_*_UTIL_RATIO" in family.help
    else:
        assert old in family.help and new in family.help, family.help


def test_the_gpu_utilization_field_is_mapped_in_both_spellings() -> None:
    """DCGM_FI_DEV_GPU_UTIL (0-100) became DCGM_FI_DEV_GPU_UTIL_RATIO (0-1) in dcgm-exporter 4.9."""
    (bullet,) = [b for b in DOC.read_text().split("\n- ") if b.startswith("`DCGM_FI_DEV_GPU_UTIL`")]
    assert "`DCGM_FI_DEV_GPU_UTIL_RATIO`" in bullet and "`jaxmon_device_duty_cycle_ratio`" in bullet


def test_a_dashboard_that_names_a_dcgm_field_names_its_new_spelling_too() -> None:
    """The panels' descriptions name DCGM's fields without the DCGM_FI_PROF_ prefix (`DCGM's SM_ACTIVE`)."""
    seen = 0
    for path in sorted((ROOT / "grafana" / "dashboards").glob("*.json")):
        descriptions = re.findall(r'"description": "((?:[^"\\]|\\.)*)"', path.read_text())
        for text in (json.loads(f'"{d}"') for d in descriptions):
            for old, (new, _, _) in RENAMED.items():
                short_old, short_new = old.removeprefix("DCGM_FI_PROF_"), new.removeprefix("DCGM_FI_PROF_")
                if re.search(rf"(?<![A-Z0-9_]){short_old}(?![A-Z0-9_])", text):
                    seen += 1
                    assert short_new in text, (path.name, text)
    assert seen >= 5  # the ladder row's SM, tensor, occupancy, DRAM and engine panels, on two dashboards
