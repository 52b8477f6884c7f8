"""The installed pynvml (nvidia-ml-py, at its pyproject floor in tests/floors.sh) has what the nvml source calls.
The nvml source's own tests load the fake libnvidia-ml.so.1 and run in tests/e2e; these need no library."""

from __future__ import annotations

import ast
import ctypes
from pathlib import Path

import pynvml

from tests.conftest import ROOT

NVML_SOURCE = ROOT / "jaxmon" / "sources" / "nvml"


def pynvml_names(path: Path) -> set[str]:
    """Every `pynvml.<name>` the module reads directly (a `getattr(pynvml, name, default)` has its own fallback)."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml"
    }


def test_pynvml_has_every_name_the_nvml_source_reads() -> None:
    """nvidia-ml-py 12.535 has no nvmlDeviceGetComputeRunningProcesses_v2, the call a driver without the v3 call is
    read with: the nvml source would fail each poll there with an AttributeError, not at import."""
    used = set().union(*(pynvml_names(p) for p in NVML_SOURCE.glob("*.py")))
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in used
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []


def test_pynvml_reads_processes_into_nvmls_own_struct() -> None:
    """nvmlProcessInfo_v2_t, what nvmlDeviceGetComputeRunningProcesses_v3 fills, is 24 bytes (pid, used memory,
    GPU and compute instance ids). nvidia-ml-py 12.535.77 reads it as 32 (an extra usedGpuCcProtectedMemory), so
    every process after the first is read from the wrong offset."""
    struct = getattr(pynvml, "c_nvmlProcessInfo_v3_t", pynvml.c_nvmlProcessInfo_t)
    assert ctypes.sizeof(struct) == 24, [name for name, _ in struct._fields_]
