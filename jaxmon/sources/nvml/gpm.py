"""GPM (GPU Performance Monitoring, Hopper and newer): the profiling counters DCGM calls DCP fields, read through
NVML itself, without DCGM's host engine.

A GPM value is an average over the interval between two samples. Each GPU that supports it (and each of its MIG GPU
instances) therefore keeps the previous poll's sample; every poll takes a new one on the thread reading the GPU and asks
`nvmlGpmMetricsGet` for all of jaxmon's metrics over the interval between the two, in one call. So:

- nothing is reported until a second sample exists;
- an interval shorter than NVML's floor (100 ms: shorter ones give invalid values) is never used: the older sample is
  kept, and the last values stand, until 100 ms have passed since it was taken (measured from when the sample call
  returned, so that NVML's own interval is never shorter);
- the call's return and each metric's own `nvmlReturn` are checked: a metric that failed is absent, never 0.

GPM unsupported arrives as `isSupportedDevice = 0`, `NOT_SUPPORTED`, `FUNCTION_NOT_FOUND` (an old driver) or
`ARGUMENT_VERSION_MISMATCH`: the GPU then has no GPM values and `supported` False, with the reason. `GPU_IS_LOST`
fails the GPU's read like any other call (its samples are freed then: library.py). Any other error of a GPM call
leaves that poll's GPM values out (logged when it starts or changes) and starts that unit's sampling afresh.

Samples are opaque allocations in the driver: two per sampled unit, reused in turn, freed by `free()` (on shutdown,
when the GPU's read fails, and for a GPU instance that no longer exists).

Thread safety: one `GpuGpm` per GPU, used by the thread reading that GPU alone (a GPU is read by one thread at a
time), and by `Nvml.close()` where no read of the GPU is in flight.
"""

from __future__ import annotations

import ctypes
import math
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pynvml
import structlog

from jaxmon.sources.nvml.calls import describe
from jaxmon.sources.nvml.readings import GPM_METRICS, GpmValues

log = structlog.get_logger("jaxmon.sources.nvml")

# NVML's shortest interval between two samples (nvml.h: shorter intervals give invalid values).
FLOOR_SECONDS = 0.1
# The ways "no GPM here" arrives, and what each means.
UNSUPPORTED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: "GPM is not supported on this GPU",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "this driver's NVML has no GPM calls (GPM needs driver 520 or newer)",
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "this driver's NVML takes another version of the GPM structs",
}
# An error of a GPM call that fails the GPU's whole read (as it does every other call's).
FAILS_GPU = (pynvml.NVML_ERROR_GPU_IS_LOST,)
_IDS = tuple(GPM_METRICS)
# The metrics array of c_nvmlGpmMetricsGet_t (offset 24) and each c_nvmlGpmMetric_t (40 bytes): metricId (uint),
# nvmlReturn (uint), value (double), then metricInfo's three pointers, which jaxmon does not read.
_METRICS_AT = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
_METRIC_SIZE = ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
assert (
    pynvml.c_nvmlGpmMetric_t.metricId.offset,
    pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset,
    pynvml.c_nvmlGpmMetric_t.value.offset,
) == (0, 4, 8)
_ENTRIES = struct.Struct("=" + f"IId{_METRIC_SIZE - 16}x" * len(_IDS))
_ASK = [x for metric in _IDS for x in (metric, pynvml.NVML_ERROR_UNKNOWN, math.nan)]


def _why(err: pynvml.NVMLError) -> str:
    return f"{UNSUPPORTED[err.value]}: {describe(err)}"


@dataclass
class _Unit:
    """One sampled unit, the whole GPU (`gpu_instance` None) or one MIG GPU instance: its two samples in turn."""

    gpu_instance: int | None
    previous: Any = None  # the sample of the previous interval's end, taken at `taken` (time.monotonic())
    taken: float = 0.0
    spare: Any = None  # the sample the next poll fills
    values: GpmValues | None = None
    error: str | None = None  # the GPM error logged last for this unit, None while it works
    off: bool = False  # NOT_SUPPORTED for this unit alone (a MIG GPU instance): not asked again while it exists

    def free(self) -> None:
        for sample in (self.previous, self.spare):
            if sample is not None:
                try:
                    pynvml.nvmlGpmSampleFree(sample)
                except pynvml.NVMLError as err:  # nothing to do about it; the rest must still be freed
                    log.warning("NVML GPM sample free failed", error=describe(err))
        self.previous = self.spare = None
        self.values = None


@dataclass
class GpuGpm:
    """One GPU's GPM: whether NVML serves it (asked once per handle) and its sampled units."""

    index: int
    # Called once with the reason when the GPU turns out unsupported (the library logs it once per GPU).
    on_unsupported: Callable[[int, str], None] | None = None
    supported: bool | None = None
    reason: str | None = None
    _units: dict[int | None, _Unit] = field(default_factory=dict)
    _request: Any = None  # one c_nvmlGpmMetricsGet_t, reused for every call of this GPU's units
    _entries: Any = None  # the request's bytes, for struct's pack_into and unpack_from

    def read(self, handle: Any, gpu_instances: Iterable[int] = ()) -> tuple[GpmValues | None, dict[int, GpmValues]]:
        """Sample the GPU and its GPU instances: (the GPU's values, values by GPU instance); raises the NVML errors
        that fail the GPU (GPU_IS_LOST)."""
        if self.supported is None:
            self._query(handle)
        if not self.supported:
            return None, {}
        instances = set(gpu_instances)
        for gone in [gi for gi in self._units if gi is not None and gi not in instances]:
            self._units.pop(gone).free()
        try:
            whole = self._step(self._unit(None), partial(pynvml.nvmlGpmSampleGet, handle), mig=bool(instances))
            per_instance = {}
            for gi in sorted(instances):
                got = self._step(self._unit(gi), partial(pynvml.nvmlGpmMigSampleGet, handle, gi), mig=True)
                if got is not None:
                    per_instance[gi] = got
        except _Unsupported as err:
            self._unsupported(err.reason)
            return None, {}
        return whole, per_instance

    def free(self) -> None:
        """Free every sample of this GPU (its read failed, or NVML shuts down); support is asked again next time."""
        for unit in self._units.values():
            unit.free()
        self._units.clear()
        self.supported = None

    def live_samples(self) -> int:
        """How many samples this GPU holds (two per unit once it has sampled twice)."""
        return sum((u.previous is not None) + (u.spare is not None) for u in self._units.values())

    def _unit(self, gpu_instance: int | None) -> _Unit:
        unit = self._units.get(gpu_instance)
        if unit is None:
            unit = self._units[gpu_instance] = _Unit(gpu_instance)
        return unit

    def _query(self, handle: Any) -> None:
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(handle)
        except pynvml.NVMLError as err:
            if err.value in UNSUPPORTED:
                self._unsupported(_why(err))
                return
            raise
        if not int(support.isSupportedDevice):
            self._unsupported("NVML says this GPU has no GPM (isSupportedDevice = 0: GPM needs Hopper or newer)")
            return
        self.supported, self.reason = True, None

    def _unsupported(self, reason: str) -> None:
        self.free()
        self.supported, self.reason = False, reason
        if self.on_unsupported is not None:
            self.on_unsupported(self.index, reason)

    def _step(self, unit: _Unit, take: Callable[[Any], object], mig: bool) -> GpmValues | None:
        """Take the unit's next sample unless the last one is younger than the floor; its values over the interval
        (the last values while the floor holds; None before a second sample or after a failed call)."""
        if unit.off:
            return None
        if unit.previous is not None and time.monotonic() - unit.taken < FLOOR_SECONDS:
            return unit.values
        try:
            if unit.spare is None:
                unit.spare = pynvml.nvmlGpmSampleAlloc()
            take(unit.spare)
            taken = time.monotonic()
            if unit.previous is None:
                unit.previous, unit.spare, unit.taken = unit.spare, None, taken
                return None
            values = self._metrics(unit.previous, unit.spare)
            unit.previous, unit.spare, unit.taken = unit.spare, unit.previous, taken
        except pynvml.NVMLError as err:
            if err.value in FAILS_GPU:
                raise
            whole_gpu = unit.gpu_instance is None and not mig
            if err.value in UNSUPPORTED and (whole_gpu or err.value != pynvml.NVML_ERROR_NOT_SUPPORTED):
                # The library has no GPM (or another version of it), or the GPU's own sampling says no: no GPM on
                # this GPU. In MIG mode NOT_SUPPORTED for one unit turns that unit off alone.
                raise _Unsupported(_why(err)) from err
            # One unit failing (a GPU instance gone meanwhile, an invalid interval): no values this poll, and its
            # sampling starts afresh; a unit NVML does not sample (NOT_SUPPORTED) stays off.
            self._failed(unit, describe(err))
            unit.free()
            unit.off = err.value == pynvml.NVML_ERROR_NOT_SUPPORTED
            return None
        if unit.error is not None:
            log.info("NVML GPM works again", gpu=self.index, gpu_instance=unit.gpu_instance)
            unit.error = None
        unit.values = values
        return values

    def _metrics(self, first: Any, second: Any) -> GpmValues:
        """Every metric of jaxmon's over the interval from `first` to `second`, in one call; a failed one is left
        out (and so is a value that is not a number)."""
        request = self._request
        if request is None:
            # The binding's struct (NVML_GPM_METRIC_MAX entries: the largest it knows); numMetrics stays ours.
            request = self._request = pynvml.c_nvmlGpmMetricsGet_t()
            self._entries = (ctypes.c_char * ctypes.sizeof(request)).from_buffer(request)
        # pynvml's nvmlGpmMetricsGet does not set the version: the caller does.
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_IDS)
        request.sample1, request.sample2 = first, second
        # Each entry asks for its id again (NVML writes its result over it), with no result yet: a stale value is
        # never read. One pack and one unpack for all entries (ctypes attribute access costs ~0.3 us each).
        _ENTRIES.pack_into(self._entries, _METRICS_AT, *_ASK)
        pynvml.nvmlGpmMetricsGet(request)
        got = _ENTRIES.unpack_from(self._entries, _METRICS_AT)
        out = []
        for i, metric in enumerate(_IDS):
            echoed, result, value = got[3 * i : 3 * i + 3]
            if result == pynvml.NVML_SUCCESS and echoed == metric and math.isfinite(value):
                out.append((metric, value / 100.0))
        return tuple(out)

    def _failed(self, unit: _Unit, error: str) -> None:
        if error != unit.error:
            log.warning("NVML GPM read failed", gpu=self.index, gpu_instance=unit.gpu_instance, error=error)
            unit.error = error


class _Unsupported(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
