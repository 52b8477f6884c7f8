"""The fake NVML: fakenvml.c compiled with gcc into `libnvidia-ml.so.1`, and the scenario file it answers from.

A daemon started with `env()` loads the fake through the dynamic loader exactly as it would load the driver's
library (pynvml does `CDLL("libnvidia-ml.so.1")`); nothing in pynvml is patched.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "fakenvml.c"
SONAME = "libnvidia-ml.so.1"
SCENARIO_VAR = "FAKENVML_SCENARIO"

# NVML's event type bit for critical Xid errors (nvml.h nvmlEventTypeXidCriticalError).
XID_EVENT = 0x8
GPU_IS_LOST = 15


@functools.cache
def build(legacy: bool = False) -> Path:
    """Compile the fake once per process; returns the directory holding `libnvidia-ml.so.1`.

    `legacy` leaves out the newer symbols (`_v2` memory info, `_v3` process list, clocks event reasons), as an old
    driver's library does.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise AssertionError("gcc not found: install gcc and libc6-dev (tests/run.sh does)")
    out = Path(tempfile.mkdtemp(prefix="fakenvml-legacy-" if legacy else "fakenvml-"))
    atexit.register(shutil.rmtree, out, True)
    # No -Werror: a newer gcc's new warnings must not fail the suite (gcc 12 is clean with -Wall -Wextra -fanalyzer).
    cmd = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-pthread", f"-Wl,-soname,{SONAME}"]
    cmd += ["-DFAKENVML_LEGACY"] if legacy else []
    cmd += ["-o", str(out / SONAME), str(SOURCE)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"building the fake NVML failed:\n{' '.join(cmd)}\n{result.stderr}")
    return out


def device(index: int, **fields: Any) -> dict[str, Any]:
    """A healthy GPU's scenario entry, with distinct readings per index; `fields` override any of them."""
    gib = 1 << 30
    entry: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index:08x}-1111-2222-3333-{index:012x}",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "memory": {"total": 80 * gib, "reserved": 512 << 20, "used": (10 + index) * gib},
        "utilization": {"gpu": 10 + index, "memory": 5 + index},
        "power_mw": 200_000 + 1000 * index,
        "power_limit_mw": 700_000,
        "temperature_c": 40 + index,
        "sm_clock_mhz": 1980 - index,
        "clocks_event_reasons": 0,
        "ecc": {"enabled": True, "corrected": index, "uncorrected": 0},
        "processes": [],
    }
    entry.update(fields)
    return entry


class Scenario:
    """The JSON file the fake reads; every write replaces it atomically (a new inode, so the fake re-reads it)."""

    def __init__(self, path: Path, devices: list[dict[str, Any]] | None = None, **top: Any) -> None:
        self.path = path
        self.data: dict[str, Any] = {"devices": devices if devices is not None else [], "events": [], **top}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data), encoding="utf-8")
        os.replace(tmp, self.path)

    def update(self, index: int, **fields: Any) -> None:
        """Change fields of device `index` (None removes a field)."""
        dev = self.data["devices"][index]
        for key, value in fields.items():
            if value is None:
                dev.pop(key, None)
            else:
                dev[key] = value
        self.write()

    def xid(self, index: int, xid: int) -> None:
        """Queue one critical Xid event on device `index`."""
        self.data["events"].append({"device": index, "type": XID_EVENT, "data": xid})
        self.write()

    def env(self, legacy: bool = False) -> dict[str, str]:
        """What a daemon needs in its environment to load the fake and read this scenario."""
        previous = os.environ.get("LD_LIBRARY_PATH")
        path = str(build(legacy)) + (f":{previous}" if previous else "")
        return {"LD_LIBRARY_PATH": path, SCENARIO_VAR: str(self.path)}
