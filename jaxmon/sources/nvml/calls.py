"""How jaxmon reads an NVML answer: which errors mean "not offered here" (an absent series), which ask for an older
call, and how an error is named in the log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

T = TypeVar("T")

# A field this GPU, driver or container does not offer: its series is absent, the device is still up.
ABSENT = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
)
# A versioned call the library has in another version only: try the older one.
OLDER = (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: the library does not load, or it does not initialise (no driver)."""


def describe(err: pynvml.NVMLError) -> str:
    """`NVML_ERROR_GPU_IS_LOST (GPU is lost)`-style text for an NVML error."""
    names = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
    return f"{names.get(err.value, f'NVML error {err.value}')} ({err})"


def probe_reason(err: pynvml.NVMLError) -> str:
    """What an nvmlInit failure means, for the log and `unavailable()`."""
    if err.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "libnvidia-ml.so.1 does not load (no NVIDIA driver library on the library path)"
    return f"NVML does not initialise: {describe(err)}"


def probe_library() -> str | None:
    """Why NVML cannot be used in this process, or None when it initialises."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return probe_reason(err)
    pynvml.nvmlShutdown()
    return None


def optional(call: Callable[[], T]) -> T | None:
    """`call()`, or None where the field is not offered here; any other NVML error fails the device."""
    try:
        return call()
    except pynvml.NVMLError as err:
        if err.value in ABSENT:
            return None
        raise


@dataclass
class Versions:
    """Which version of each versioned call this library has (learnt on the first call, then kept)."""

    memory_v2: bool = True
    processes_v3: bool = True
    clocks_event_reasons: bool = True
    # nvmlDeviceGetNumFans and nvmlDeviceGetFanSpeed_v2 (per fan); else nvmlDeviceGetFanSpeed (one fan).
    fans_v2: bool = True
    # nvmlDeviceGetProcessesUtilizationInfo (newer drivers); else nvmlDeviceGetProcessUtilization, and where the
    # library has neither (FUNCTION_NOT_FOUND) `process_utilization` goes False and neither is asked again.
    processes_utilization_info: bool = True
    process_utilization: bool = True


def memory(handle: Any, versions: Versions) -> tuple[int | None, int | None]:
    """(total, used) device memory of a GPU or a MIG device; (None, None) where NVML does not report it."""
    # v2 (driver 510+) reports the driver's reservation apart; v1 counts it as used.
    if versions.memory_v2:
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            return int(mem.total), int(mem.used)
        except pynvml.NVMLError as err:
            if err.value not in OLDER:
                if err.value in ABSENT:
                    return None, None
                raise
            versions.memory_v2 = False
    mem = optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    return (None, None) if mem is None else (int(mem.total), int(mem.used))


def text(value: str | bytes) -> str:
    """A char array pynvml hands back: str (its _PrintableStructure decodes them), bytes from older versions."""
    return value.decode() if isinstance(value, bytes) else str(value)
