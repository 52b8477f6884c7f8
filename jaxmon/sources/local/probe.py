"""The probe kernel on one JAX device, and the registry that keeps its arrays out of the workload's live arrays."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

# The probe's own arrays, so live-array accounting leaves them out: id -> weak reference (the identity check makes
# a reused id harmless). An array is registered under _OWN_LOCK in the same step that creates it, and the
# accounting lists live arrays under the same lock, so it never sees a probe array that is not registered yet.
_OWN_LOCK = threading.Lock()
_OWN: dict[int, weakref.ref[Any]] = {}


def _own(*arrays: Any) -> None:
    """Register `arrays` as the probe's (call with _OWN_LOCK held); forget the ones gone since."""
    for key in [key for key, ref in _OWN.items() if ref() is None]:
        del _OWN[key]
    for arr in arrays:
        _OWN[id(arr)] = weakref.ref(arr)


class JaxProbeKernel:
    """A matmul chain `x = tanh(x @ w)` run `steps` times in one compiled while loop on one device."""

    def __init__(self, jax: Any, device: Any, size: int) -> None:
        jnp = jax.numpy
        lax = jax.lax
        self._jax = jax
        self._device = device
        # Inputs are made on the host and placed explicitly on this device (never computed on the implicit
        # default device, DESIGN.md section 5), so the probe adds exactly one compilation per device.
        # w ~ N(0, 1/n) keeps tanh(x @ w) away from saturation and denormals over many steps.
        rng = np.random.default_rng(0)
        x = rng.standard_normal((size, size), dtype=np.float32)
        w = (rng.standard_normal((size, size), dtype=np.float32) / np.float32(np.sqrt(size))).astype(np.float32)
        with _OWN_LOCK:
            self._x = jax.device_put(x, device)
            self._w = jax.device_put(w, device)
            _own(self._x, self._w)
        self._steps_cache: dict[int, Any] = {}

        def chain(x: Any, w: Any, steps: Any) -> Any:
            return lax.fori_loop(0, steps, lambda _, c: jnp.tanh(c @ w), x)

        with _OWN_LOCK:  # used only to lower the program, but alive meanwhile: the probe's too
            steps0 = jax.device_put(np.int32(1), device)
            _own(steps0)
        self._compiled = jax.jit(chain).lower(self._x, self._w, steps0).compile()
        cost = self._compiled.cost_analysis()
        if isinstance(cost, list):  # older jaxlib returns one dict per computation
            cost = cost[0] if cost else {}
        flops = float(cost.get("flops", 0.0)) if cost else 0.0
        # The while loop's cost analysis counts the body once: that is the FLOPs of one step.
        self.flops_per_step = flops if flops > 0 else 2.0 * size**3
        mem = self._compiled.memory_analysis()
        if mem is not None:
            self.footprint_bytes = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes)
        else:
            self.footprint_bytes = int(3 * size * size * 4)

    def run(self, steps: int) -> None:
        """Run the chain `steps` times and wait for the device to finish."""
        arg = self._steps_cache.get(steps)
        if arg is None:
            with _OWN_LOCK:
                arg = self._jax.device_put(np.int32(steps), self._device)
                _own(arg)
            self._steps_cache = {steps: arg}  # keep one: steps changes only at calibration
        with _OWN_LOCK:  # dispatch is asynchronous: the lock is not held while the device computes
            out = self._compiled(self._x, self._w, arg)
            _own(out)
        out.block_until_ready()
        del out  # the result is the probe's own too: never left for live_arrays() to find
