"""This process's JAX devices: discovery, the sidecar's GPU defaults, `memory_stats()` reads, the probe kernel."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

import jaxmon.sources.local.private as private
from jaxmon.device_readings import BackendStatus, DeviceInfo
from jaxmon.sources.local.probe import JaxProbeKernel

log = structlog.get_logger("jaxmon.sources.local")

# DESIGN.md section 3: a second JAX process preallocates 75 % of the GPU unless told otherwise.
PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def apply_gpu_env_defaults(environ: MutableMapping[str, str], memory_fraction: float) -> dict[str, str]:
    """Set the sidecar's non-preallocating defaults unless the user set them; returns what was set."""
    applied: dict[str, str] = {}
    if PREALLOCATE_VAR not in environ:
        environ[PREALLOCATE_VAR] = applied[PREALLOCATE_VAR] = "false"
    # Setting both names raises inside JAX, so only ever set the current one, and only if neither is set.
    if not any(name in environ for name in FRACTION_VARS):
        environ[FRACTION_VARS[0]] = applied[FRACTION_VARS[0]] = f"{memory_fraction:g}"
    return applied


# JAX registers a TPU factory even where libtpu is not installed; that is absence, not a failure.
_NOT_INSTALLED = re.compile(r"cannot open shared object file|No such file or directory|Unknown backend")
_FAILED_BACKEND = re.compile(r"Unable to initialize backend '([^']+)'")
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def _requested() -> set[str]:
    """The platforms JAX_PLATFORMS names (a failure of one of these is reported even when it looks not installed)."""
    return {p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}


def _coords(device: Any) -> str | None:
    coords = getattr(device, "coords", None)
    if coords is None:
        return None
    try:
        return ",".join(str(int(c)) for c in coords)
    except (TypeError, ValueError):
        return None


class LocalSource:
    """Every local device of every backend JAX can start in this process."""

    name = "local"
    runs_probes = True

    def __init__(
        self,
        gpu_memory_fraction: float = 0.02,
        environ: MutableMapping[str, str] | None = None,
        sidecar_defaults: bool = True,
    ) -> None:
        env = os.environ if environ is None else environ
        # A sidecar must not preallocate the GPU; inside a workload (embedded, publisher) the trainer's own
        # settings stand and jaxmon changes nothing.
        self.applied_env = apply_gpu_env_defaults(env, gpu_memory_fraction) if sidecar_defaults else {}
        import jax  # imported here so the environment above is in place first

        self._jax = jax
        self._devices: dict[tuple[str, int], Any] = {}

    def _backends(self) -> tuple[dict[str, Any], dict[str, str]]:
        requested = _requested()
        loud_error: dict[str, str] = {}
        try:
            backends, errors = private.backends(self._jax, requested)
        except RuntimeError as exc:
            # A plugin that fails loudly aborts JAX's loop; the backends started before it stay usable.
            match = _FAILED_BACKEND.search(str(exc))
            loud_error[match.group(1) if match else "unknown"] = str(exc)
            try:
                backends, errors = private.backends(self._jax, requested)
            except Exception as again:  # nothing at all started
                loud_error.setdefault("unknown", str(again))
                backends, errors = {}, private.backend_errors()
        errors.update(loud_error)
        return backends, errors

    def discover(self) -> tuple[list[DeviceInfo], list[BackendStatus]]:
        """Start every backend that can start; report the ones that cannot, and why."""
        backends, errors = self._backends()
        requested = _requested()
        statuses: list[BackendStatus] = []
        devices: list[DeviceInfo] = []
        for name, backend in sorted(backends.items()):
            statuses.append(BackendStatus(name=name, up=True))
            for dev in backend.local_devices():
                info = DeviceInfo(
                    id=int(dev.id),
                    platform=str(dev.platform),
                    device_kind=str(dev.device_kind),
                    process_index=int(dev.process_index),
                    coords=_coords(dev),
                    core_on_chip=getattr(dev, "core_on_chip", None),
                    num_cores=num_cores if isinstance(num_cores := getattr(dev, "num_cores", None), int) else None,
                )
                if info.key not in self._devices:
                    self._devices[info.key] = dev
                    devices.append(info)
        for name, message in sorted(errors.items()):
            if name in backends:
                continue
            if name not in requested and _NOT_INSTALLED.search(message):
                continue
            statuses.append(BackendStatus(name=name, up=False, error=message))
        devices.sort(key=lambda d: (d.platform, d.id))
        if self.applied_env:
            # Worth a line only where a GPU backend started: on a CPU-only host the defaults change nothing.
            gpu = any(d.platform in _GPU_PLATFORMS for d in devices)
            (log.info if gpu else log.debug)("sidecar GPU defaults set before importing JAX", **self.applied_env)
        return devices, statuses

    def read_memory(self, device: DeviceInfo) -> Mapping[str, Any] | None:
        """`memory_stats()` of one device: None when unsupported; raises what JAX raises."""
        stats: Mapping[str, Any] | None = self._devices[device.key].memory_stats()
        return stats

    def make_probe(self, device: DeviceInfo, size: int) -> JaxProbeKernel:
        """Place and compile the probe on `device` (call from the probe's own thread: it may hang)."""
        return JaxProbeKernel(self._jax, self._devices[device.key], size)
