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
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "fakenvml.c"
SONAME = "libnvidia-ml.so.1"
SCENARIO_VAR = "FAKENVML_SCENARIO"
STATE_VAR = "FAKENVML_STATE"

# NVML's event type bit for critical Xid errors (nvml.h nvmlEventTypeXidCriticalError).
XID_EVENT = 0x8
GPU_IS_LOST = 15
# The daemon's deadline for a GPU's reads is 2 s, or half a short poll interval: 0.15 s at the suite's 0.3 s polls,
# which healthy fake GPUs were seen to miss on a loaded 2-core machine beside the other test worker (they were then
# reported hung, their series gone). A daemon given a scenario's environment takes this one from it; the tests of
# the deadline pass --collector.nvml.timeout, which wins over the environment.
READ_DEADLINE = ("JAXMON_COLLECTOR__NVML__TIMEOUT", "10s")


@functools.cache
def build(legacy: bool = False, process_utilization: bool = True) -> Path:
    """Compile the fake once per process and variant; returns the directory holding `libnvidia-ml.so.1`.

    `legacy` leaves out the newer symbols (`_v2` memory info, `_v3` process lists, clocks event reasons, the fan
    count and per-fan speed, the row remapper, MIG, GPM, the versioned temperature, the `_v2` CUDA driver version,
    nvmlDeviceGetProcessesUtilizationInfo), as an old driver's library does; `process_utilization=False` leaves out
    both per-process utilization calls, as a driver without them.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise AssertionError("gcc not found: install gcc and libc6-dev (tests/run.sh does)")
    prefix = "fakenvml-" + ("legacy-" if legacy else "") + ("" if process_utilization else "noutil-")
    out = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, out, True)
    # No -Werror: a newer gcc's new warnings must not fail the suite (gcc 12 is clean with -Wall -Wextra -fanalyzer).
    cmd = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-pthread", f"-Wl,-soname,{SONAME}"]
    cmd += ["-DFAKENVML_LEGACY"] if legacy else []
    cmd += [] if process_utilization else ["-DFAKENVML_NO_PROCESS_UTILIZATION"]
    cmd += ["-o", str(out / SONAME), str(SOURCE)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"building the fake NVML failed:\n{' '.join(cmd)}\n{result.stderr}")
    return out


# A plausible H200 SXM (141 GB HBM3e, 18 NVLink 4 links, no fans, MIG-capable). No GPU was at hand when these were
# chosen: the memory total NVML reports (143 771 MiB), the clock maxima (graphics and SM 1980 MHz, memory 2619 MHz,
# video 1965 MHz) and the MIG profiles' sizes are assumptions from NVIDIA's published specifications and what
# nvidia-smi is known to show on H100, not readings of a real H200.
H200_NAME = "NVIDIA H200"
H200_MEMORY = 143_771 << 20
H200_MAX_CLOCKS_MHZ = {"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1965}
H200_LINKS = 18
# H200 MIG profiles with NVML's approximate memory per GPU instance (assumed).
MIG_PROFILES = {"1g.18gb": 16_896 << 20, "1g.35gb": 33_280 << 20, "2g.35gb": 33_280 << 20, "3g.71gb": 71_168 << 20}


def link(index: int, link_no: int, active: bool = True, **fields: Any) -> dict[str, Any]:
    """One NVLink of GPU `index`: traffic distinct per GPU and link, no errors; `fields` override."""
    entry: dict[str, Any] = {
        "active": active,
        "tx_kib": 1_000_000 * (index + 1) + 1000 * link_no,
        "rx_kib": 2_000_000 * (index + 1) + 1000 * link_no,
        "replay": 0,
        "recovery": 0,
        "crc_flit": 0,
        "crc_data": 0,
    }
    entry.update(fields)
    return entry


def mig_device(gpu: int, slot: int, profile: str, gpu_instance: int, **fields: Any) -> dict[str, Any]:
    """One MIG device of GPU `gpu` at MIG index `slot`, named as NVML names MIG devices (`... MIG 1g.18gb`)."""
    entry: dict[str, Any] = {
        "index": slot,
        "uuid": f"MIG-{gpu:08x}-{slot:04x}-4444-5555-{gpu_instance:012x}",
        "name": f"{H200_NAME} MIG {profile}",
        "gpu_instance": gpu_instance,
        "compute_instance": 0,
        "memory": {"total": MIG_PROFILES[profile], "reserved": 0, "used": (slot + 1) << 30},
    }
    entry.update(fields)
    return entry


# GPM metric ids (nvml.h nvmlGpmMetricId_t) the fake's H200s report, by the series jaxmon gives them.
GPM_IDS = {
    "graphics_engine": 1,
    "sm_active": 2,
    "sm_occupancy": 3,
    "pipe_integer": 4,
    "tensor_active": 5,
    "pipe_tensor_dfma": 6,
    "pipe_tensor_hmma": 7,
    "pipe_tensor_imma": 9,
    "dram_active": 10,
    "pipe_fp64": 11,
    "pipe_fp32": 12,
    "pipe_fp16": 13,
}


def gpm_metrics(index: int, **percent: float) -> dict[str, float]:
    """GPU `index`'s GPM percentages by metric id (as the scenario's "metrics" keys them), distinct per GPU: a busy
    training GPU's. `percent` overrides them by the names of GPM_IDS (`sm_active=20.0`)."""
    values = {
        "graphics_engine": 95.5 - index,
        "sm_active": 80.5 - index,
        "sm_occupancy": 35.25 + index,
        "pipe_integer": 5.5 + index,
        "tensor_active": 60.5 - index,
        "pipe_tensor_dfma": 0.0,
        "pipe_tensor_hmma": 55.75 - index,
        "pipe_tensor_imma": 1.5 + index,
        "dram_active": 45.5 + index,
        "pipe_fp64": 0.25,
        "pipe_fp32": 12.5 + index,
        "pipe_fp16": 3.5 + index,
    }
    values.update(percent)
    return {str(GPM_IDS[name]): value for name, value in values.items()}


def gpm(index: int, errors: dict[str, int] | None = None, **percent: float) -> dict[str, Any]:
    """A scenario's "gpm" entry for GPU `index` (GPM supported), `errors` by GPM_IDS name (an NVML error each)."""
    entry: dict[str, Any] = {"supported": True, "metrics": gpm_metrics(index, **percent)}
    if errors:
        entry["errors"] = {str(GPM_IDS[name]): code for name, code in errors.items()}
    return entry


def device(index: int, **fields: Any) -> dict[str, Any]:
    """A healthy H200's scenario entry, with distinct readings per index; `fields` override any of them."""
    gib = 1 << 30
    entry: dict[str, Any] = {
        "name": H200_NAME,
        "uuid": f"GPU-{index:08x}-1111-2222-3333-{index:012x}",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "memory": {"total": H200_MEMORY, "reserved": 512 << 20, "used": (10 + index) * gib},
        "utilization": {"gpu": 10 + index, "memory": 5 + index},
        "encoder_util": 0,
        "decoder_util": index,
        "power_mw": 200_000 + 1000 * index,
        "power_limit_mw": 700_000,
        "power_management_limit_mw": 700_000,
        "energy_mj": 3_600_000_000 + 1_000_000 * index,
        "temperature_c": 40 + index,
        "clocks_mhz": {"graphics": 1980 - index, "sm": 1980 - index, "memory": 2619, "video": 1755 - index},
        "max_clocks_mhz": dict(H200_MAX_CLOCKS_MHZ),
        "clocks_event_reasons": 0,
        "ecc": {"enabled": True, "corrected": index, "uncorrected": 0},
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "pcie": {"tx_kbps": 1000 * (index + 1), "rx_kbps": 2000 * (index + 1), "replays": 0},
        "nvlink": [link(index, n) for n in range(H200_LINKS)],
        "mig": {"current": 0, "pending": 0, "max_devices": 7, "devices": []},
        "processes": [],
        "gpm": gpm(index),
    }
    entry.update(fields)
    return entry


class Scenario:
    """The JSON file the fake reads; every write replaces it atomically (a new inode, so the fake re-reads it)."""

    def __init__(self, path: Path, devices: list[dict[str, Any]] | None = None, **top: Any) -> None:
        self.path = path
        self.state_path = path.with_name(path.stem + ".state.json")
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

    def hang(self, index: int, seconds: float) -> None:
        """Wedge device `index` for `seconds` from now: every NVML call on it blocks until then (as calls on a GPU
        fallen off the bus can), without holding up the other devices' calls; then it answers again by itself."""
        self.update(index, hang_until=time.time() + seconds)

    def xid(self, index: int, xid: int) -> None:
        """Queue one critical Xid event on device `index`."""
        self.data["events"].append({"device": index, "type": XID_EVENT, "data": xid})
        self.write()

    def state(self) -> dict[str, int]:
        """What the fake reports of itself (its GPM sample counts: `gpm_live_samples`, `gpm_allocated`, `gpm_freed`,
        `gpm_short_intervals`, `gpm_bad_samples`; `blocked_calls`, the device calls inside a `delay_ms` or a hang
        now); {} before its first GPM sample or blocked call."""
        try:
            state: dict[str, int] = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return state

    def blocked_calls(self) -> int:
        """How many device calls are inside a `delay_ms` or a hang now."""
        return self.state().get("blocked_calls", 0)

    def env(self, legacy: bool = False, process_utilization: bool = True) -> dict[str, str]:
        """What a daemon needs in its environment to load the fake (`build`'s variant), read this scenario and report
        its state, with a read deadline a loaded machine does not miss (READ_DEADLINE)."""
        previous = os.environ.get("LD_LIBRARY_PATH")
        path = str(build(legacy, process_utilization)) + (f":{previous}" if previous else "")
        var, deadline = READ_DEADLINE
        return {"LD_LIBRARY_PATH": path, SCENARIO_VAR: str(self.path), STATE_VAR: str(self.state_path), var: deadline}
