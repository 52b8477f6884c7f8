"""Orbax's and Grain's own Prometheus telemetry beside jaxmon.start(), run as a child process by
tests/e2e/test_library_telemetry.py with ENABLE_ORBAX_PROMETHEUS_TELEMETRY=true and
ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true in its environment.

Usage: telemetry.py {libraries-first,jaxmon-first} DIR. Imports orbax.checkpoint and grain before jaxmon (each may
set PROMETHEUS_MULTIPROC_DIR and start its own HTTP server at import) or jaxmon first, starts jaxmon on a free
port, saves a small checkpoint for real (Orbax's duration events) and reads a real Grain pipeline, then answers
`OK <json>` once: jaxmon's URL, PROMETHEUS_MULTIPROC_DIR as the libraries left it, the class prometheus_client
keeps values in (MmapedValue when that directory was set before prometheus_client's first import) and the TCP ports
this process listens on (the libraries' servers among them). Then reads `exit` on stdin and answers
`OK {"stopped": true}`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

# The order of the first imports (orbax.checkpoint before grain: Orbax sets PROMETHEUS_MULTIPROC_DIR before it imports
# prometheus_client, Grain imports prometheus_client first). Everything that might import prometheus_client is
# imported in main(), after these.
ORDERS = {
    "libraries-first": ("orbax.checkpoint", "grain", "jaxmon"),
    "jaxmon-first": ("jaxmon", "grain", "orbax.checkpoint"),
}


def listening_ports() -> list[int]:
    """The TCP ports this process listens on: its socket inodes (/proc/self/fd) matched to /proc/net/tcp{,6}'s
    LISTEN rows (state 0A), so a server of another process on the same port is not counted."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def main() -> None:
    for module in ORDERS[sys.argv[1]]:
        importlib.import_module(module)
    import grain
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from prometheus_client import values

    import jaxmon
    from jaxmon.logsetup import configure_logging

    configure_logging("info", "json", stream=sys.stderr)
    exporter = jaxmon.start(0, workload="telemetry", poll={"interval": 0.2}, collector={"probe": False})
    # A real save: Orbax records its write durations through jax.monitoring, which its telemetry turns into
    # prometheus_client histograms.
    ocp.Checkpointer(ocp.StandardCheckpointHandler()).save(
        Path(sys.argv[2]) / "ckpt", args=ocp.args.StandardSave({"w": jnp.arange(1024.0)})
    )
    # A real pipeline: each next() is an observation of grain_python_dataset_next_duration_ns.
    batches = iter(grain.MapDataset.range(1000).map(lambda x: x * 2).batch(8).to_iter_dataset())
    read = [int(next(batches)[0]) for _ in range(5)]
    print(
        "OK "
        + json.dumps(
            {
                "url": exporter.url,
                "read": read,
                "multiproc_dir": os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
                "value_class": values.ValueClass.__name__,
                "ports": listening_ports(),
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        if line.split() == ["exit"]:
            break
    exporter.stop()
    print("OK " + json.dumps({"stopped": True}), flush=True)


if __name__ == "__main__":
    main()
