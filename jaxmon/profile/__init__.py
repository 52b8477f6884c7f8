"""Profiles: where each device's time goes in a traced window, read from the `.xplane.pb` a JAX trace writes.

Groundwork for issue 34's sampled traces (not yet wired into the tracker or exported): pure modules on bytes, with
no JAX and no protobuf dependency, so they run in any jaxmon process and off the training thread.

- `xspace`: a reader of the serialized XSpace protobuf (tsl's xplane.proto, field numbers in its docstring);
- `classify`: which events are compute, collectives (and which kind) or copies, on which local device, per
  platform (CPU, GPU, TPU layouts);
- `intervals`: unions of intervals and the precedence split (compute, exposed collective, copy, idle);
- `analysis`: `read(bytes) -> Trace`, then `Trace.split(t0_ns, t1_ns)` per device.
"""

from __future__ import annotations

from jaxmon.profile.analysis import Trace, read
from jaxmon.profile.classify import COLLECTIVE_OPS, Device
from jaxmon.profile.intervals import Split
from jaxmon.profile.xspace import XSpaceError

__all__ = ["COLLECTIVE_OPS", "Device", "Split", "Trace", "XSpaceError", "read"]
