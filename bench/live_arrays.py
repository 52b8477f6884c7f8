"""Time of the memory poll's pass over `jax.live_arrays()` in a process holding a large model (issue 34).

    .venv/bin/python bench/live_arrays.py                 # about a minute
    .venv/bin/python bench/live_arrays.py --arrays 10000 --passes 20

The embedded memory collector makes one pass over the workload's live arrays every poll, on its own thread: the
bytes in device memory where the allocator reports nothing, the replicated bytes and the host-memory bytes
(`jaxmon.sources.local.workload.array_bytes`). This holds `--arrays` arrays of 1,024 float32 on 8 JAX CPU devices,
as a large model's parameters and optimizer state are: 40 % sharded over all 8 devices, 40 % fully replicated,
10 % on one device, 10 % replicated in pinned_host memory, each made with its own (equal) sharding object as
separate jit outputs have. It times the first pass, the median of `--passes` more, and the median of `--passes`
after every array's `addressable_shards` has been read once (the state a loop that reads them leaves: the per-shard
arrays are then live arrays too, 8 per sharded array; the pass before issue 34 read them itself in its first pass).

Run it in another checkout (`PYTHONPATH=<checkout> .venv/bin/python bench/live_arrays.py`) to compare with an
older pass: it calls `array_bytes` where there is one, else `live_array_bytes` (the pass before issue 34).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import numpy as np
from common import save
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from jaxmon.sources.local import workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--name", default="live_arrays", help="the results file: bench/results/NAME.json")
    args = ap.parse_args()
    count = getattr(workload, "array_bytes", None) or workload.live_array_bytes
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("d",))
    host = np.ones(1024, np.float32)
    kept = []
    for i in range(args.arrays):
        kind = i % 10
        if kind < 4:
            sharding: object = NamedSharding(mesh, PartitionSpec("d"))
        elif kind < 8:
            sharding = NamedSharding(mesh, PartitionSpec())
        elif kind == 8:
            sharding = SingleDeviceSharding(devices[i % len(devices)])
        else:
            sharding = NamedSharding(mesh, PartitionSpec(), memory_kind="pinned_host")
        kept.append(jax.device_put(host, sharding))
    jax.block_until_ready(kept)
    listed = len(jax.live_arrays())

    def timed() -> list[float]:
        times = []
        for _ in range(args.passes):
            t0 = time.perf_counter()
            count(jax)
            times.append(time.perf_counter() - t0)
        return times

    t0 = time.perf_counter()
    count(jax)
    first = time.perf_counter() - t0
    plain = timed()  # the old pass read every array's shards in its first: from here on it lists them too
    listed_plain = len(jax.live_arrays())
    for a in kept:
        a.addressable_shards  # noqa: B018 - cached on the array: its per-shard arrays become live arrays
    listed_after = len(jax.live_arrays())
    read = timed()
    print(
        f"{count.__name__}: {args.arrays} arrays on {len(devices)} devices: first pass {first * 1e3:.1f} ms; then"
        f" median of {args.passes} {statistics.median(plain) * 1e3:.1f} ms ({listed_plain} live arrays"
        f" listed); {statistics.median(read) * 1e3:.1f} ms once every array's shards were read ({listed_after} live"
        " arrays)",
        flush=True,
    )
    save(
        args.name,
        {
            "command": "python bench/live_arrays.py",
            "function": count.__name__,
            "arrays": args.arrays,
            "devices": len(devices),
            "live_arrays_listed_before_the_first_pass": listed,
            "first_pass_seconds": round(first, 4),
            "pass_seconds_median": round(statistics.median(plain), 4),
            "pass_seconds_min": round(min(plain), 4),
            "live_arrays_listed_after_the_passes": listed_plain,
            "live_arrays_listed_after_shards_read": listed_after,
            "pass_seconds_median_after_shards_read": round(statistics.median(read), 4),
            "pass_seconds_min_after_shards_read": round(min(read), 4),
        },
    )


if __name__ == "__main__":
    main()
