"""NVLink per link: state (nvmlDeviceGetNvLinkState), data traffic and data-link error counters.

Traffic comes from the field-values API, `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX` with the link as the
field's scope id: cumulative KiB of payload (without protocol overhead) since the driver loaded, every active link
in one `nvmlDeviceGetFieldValues` call. That is what nvml.h and nvidia-ml-py direct to on Hopper (H100, H200) and
newer; the older `nvmlDeviceGetNvLinkUtilizationCounter` is deprecated there (nvidia-ml-py: "will be removed in
CUDA 14.0") and needs a counter configuration only root may set. Errors are `nvmlDeviceGetNvLinkErrorCounter`'s
replay, recovery, CRC flit and CRC data counters. Inactive links report their state only.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import pynvml

from jaxmon.sources.nvml.calls import ABSENT
from jaxmon.sources.nvml.readings import NVLINK_ERROR_KINDS, NvLink

# pynvml 13 declares 36 links (Blackwell); 12.535 declared 18 (H100, H200: 18 links).
MAX_LINKS = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))

_ERROR_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}
assert tuple(_ERROR_COUNTERS) == NVLINK_ERROR_KINDS
# The counters in NvLink's field order (replay, recovery, crc_flit, crc_data).
_COUNTERS = tuple(_ERROR_COUNTERS.values())
ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND

# nvml.h: NVLink throughput counters, in KiB; scopeId is the link.
FI_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
FI_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX

# nvmlFieldValue_t: fieldId, scopeId (uint32), timestamp, latencyUsec (int64), valueType, nvmlReturn (uint32), and
# the 8 bytes of the nvmlValue_t union (read as an unsigned 64-bit word, then decoded by valueType).
_FIELD_VALUE = "IIqqIIQ"
assert struct.calcsize("<" + _FIELD_VALUE) == ctypes.sizeof(pynvml.c_nvmlFieldValue_t) == 40
_DECODE = {  # nvmlValueType_t -> the union member's layout, from the union's 8 bytes (little-endian)
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("<d"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("<I4x"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("<Q"),  # unsigned long: 64 bits on Linux
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("<Q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("<q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("<i4x"),
    getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): struct.Struct("<H6x"),
}


def discover(handle: Any) -> tuple[int, ...]:
    """The links this GPU has (asked once per handle): those whose state NVML reports. A link number past the GPU's
    last answers INVALID_ARGUMENT; a GPU without NVLink answers NOT_SUPPORTED for every link."""
    found = []
    for link in range(MAX_LINKS):
        try:
            pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as err:
            if err.value in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                break
            if err.value in ABSENT:
                continue
            raise
        found.append(link)
    return tuple(found)


def read(handle: Any, links: tuple[int, ...]) -> tuple[NvLink, ...] | None:
    """Every link's state, and the traffic and error counters of the active ones; None without NVLink.

    The 18 state and 72 error-counter calls of an H200 were two thirds of a poll's CPU through pynvml's wrappers
    (a function lookup under a lock, an out-parameter and a return check per call, then jaxmon's `optional`): they
    go straight to the library's functions here, with one out-parameter per read, and the same return codes
    (`ABSENT`: no value; any other error raises `NVMLError`, failing the GPU's read as pynvml's wrappers would)."""
    if not links:
        return None
    state_of = _function("nvmlDeviceGetNvLinkState")
    counter_of = _function("nvmlDeviceGetNvLinkErrorCounter")
    if state_of is None:
        return None
    value = ctypes.c_uint()
    count = ctypes.c_ulonglong()
    states = {}
    for link in links:
        if _ok(state_of(handle, link, ctypes.byref(value))):
            states[link] = value.value == pynvml.NVML_FEATURE_ENABLED
    traffic = _traffic(handle, [link for link, up in states.items() if up])
    out = []
    for link, up in states.items():
        if not up:
            out.append(NvLink(link, False))
            continue
        errors = [
            count.value if counter_of is not None and _ok(counter_of(handle, link, kind, ctypes.byref(count))) else None
            for kind in _COUNTERS
        ]
        out.append(NvLink(link, True, traffic.get((FI_TX, link)), traffic.get((FI_RX, link)), *errors))
    return tuple(out)


def _function(name: str) -> Any:
    """The library's function `name` (pynvml's cached lookup), or None where the library lacks it."""
    try:
        return pynvml._nvmlGetFunctionPointer(name)
    except pynvml.NVMLError as err:
        if err.value == ERROR_FUNCTION_NOT_FOUND:
            return None
        raise


def _ok(ret: int) -> bool:
    """True for NVML_SUCCESS, False for a value not offered here (`ABSENT`); raises for any other error."""
    if ret == pynvml.NVML_SUCCESS:
        return True
    if ret in ABSENT:
        return False
    raise pynvml.NVMLError(ret)


def _traffic(handle: Any, links: list[int]) -> dict[tuple[int, int], int]:
    """(field, link) -> bytes, for every field NVML answered: one call for all links. A field's own error (an
    older driver that does not know the field) leaves that field out.

    The array of nvmlFieldValue_t is packed and unpacked with one `struct` each (as gpm.py does its metrics):
    pynvml's structures cost a Python-level attribute hook per field read or written, 36 entries x 5 fields per
    H200 per poll."""
    if not links:
        return {}
    wanted = [(field, link) for link in links for field in (FI_TX, FI_RX)]
    fn = _function("nvmlDeviceGetFieldValues")
    if fn is None:
        return {}
    request = struct.Struct("<" + _FIELD_VALUE * len(wanted))
    buffer = bytearray(request.size)
    request.pack_into(buffer, 0, *(x for field, link in wanted for x in (field, link, 0, 0, 0, 0, 0)))
    array = (ctypes.c_char * request.size).from_buffer(buffer)
    if not _ok(fn(handle, ctypes.c_int32(len(wanted)), array)):
        return {}
    values = request.unpack_from(buffer)
    out = {}
    for n, key in enumerate(wanted):
        _, _, _, _, kind, ret, raw = values[7 * n : 7 * n + 7]
        if ret != pynvml.NVML_SUCCESS or kind not in _DECODE:
            continue
        out[key] = int(_DECODE[kind].unpack(raw.to_bytes(8, "little"))[0]) * 1024
    return out
