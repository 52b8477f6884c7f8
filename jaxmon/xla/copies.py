"""A copy's direction and bytes, as a trace says them: the kind of a copy segment (jaxmon.xla.intervals), which the
split sums by (`Split.copies`, `Split.copy_events`) and jaxmon.training.trace_links reads back (`copy_of`).

GPU: CUPTI's memcpy events name the direction (`MemcpyH2D`, `MemcpyD2H`, `MemcpyD2D`, `MemcpyP2P`: a copy between
two devices) and carry `memcpy_details`, `kind_src:pinned kind_dst:device size:4096 dest:0 async:1` (`num_bytes:`
in older collectors), whose memory kinds say the direction of a `MemcpyOther`. CPU devices' traces hold no device
event for a copy (host events without a device or bytes: seen on jax 0.10.2), and a TPU's `copy-start`/`copy-done`
say no direction: `other`, bytes unknown.
"""

from __future__ import annotations

# Copy directions (jaxmon_training_profile_copy_seconds_total's `direction`), by CUPTI's event name.
H2D, D2H, D2D, OTHER_COPY = "host_to_device", "device_to_host", "device_to_device", "other"
COPY_DIRECTIONS = (H2D, D2H, D2D, OTHER_COPY)
_MEMCPY_NAMES = {"MemcpyH2D": H2D, "MemcpyD2H": D2H, "MemcpyD2D": D2D, "MemcpyP2P": D2D}
_HOST_MEMORY = frozenset({"pageable", "pinned", "managed_host", "host"})
_DEVICE_MEMORY = frozenset({"device", "array", "peer"})


def copy_kind(name: str, details: str = "") -> str:
    """A copy segment's kind: `direction/bytes` (bytes "" where the trace does not say), from a CUPTI memcpy event's
    name (`MemcpyH2D`, ...; `MemcpyP2P` is device to device) or its `memcpy_details` (`kind_src:pinned
    kind_dst:device size:4096 dest:0 async:1`)."""
    fields = dict(f.split(":", 1) for f in details.split() if ":" in f)
    direction = _MEMCPY_NAMES.get(name.split(" ", 1)[0])
    if direction is None:
        src, dst = fields.get("kind_src", ""), fields.get("kind_dst", "")
        if src in _HOST_MEMORY and dst in _DEVICE_MEMORY:
            direction = H2D
        elif src in _DEVICE_MEMORY and dst in _HOST_MEMORY:
            direction = D2H
        elif src in _DEVICE_MEMORY and dst in _DEVICE_MEMORY:
            direction = D2D
        else:
            direction = OTHER_COPY
    size = fields.get("size", fields.get("num_bytes", ""))
    return f"{direction}/{size if size.isdigit() else ''}"


def copy_of(kind: str) -> tuple[str, int | None]:
    """(direction, bytes or None) of a copy segment's kind ("": a copy the trace says nothing of: other)."""
    direction, _, size = kind.partition("/")
    return (direction or OTHER_COPY), (int(size) if size.isdigit() else None)
