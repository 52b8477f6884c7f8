"""Placement in memory inside a real training process (issue 34): replicated and host-offloaded bytes scraped from
jaxmon.start() equal what the loop's own arrays give, and the pass over the live arrays survives a training thread
that deletes and donates arrays while it runs (a crash there is a segfault: it runs in a child process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Samples, sample
from tests.helpers import Child, wait_for_samples

PLACEMENT = ROOT / "tests" / "workloads" / "placement.py"


def test_replicated_and_host_bytes_of_a_training_loop_equal_its_own_arrays(
    children: list[Child], tmp_path: Path
) -> None:
    child = Child(tmp_path, script=PLACEMENT, env={"JAXMON_COLLECTOR__PROBE": "false"})
    children.append(child)
    url, expected = child.hello["url"], child.hello["expected"]
    assert set(expected["replicated"]) == {str(d) for d in range(8)}
    labels = {"platform": "cpu", "workload": "placement"}

    def scraped(s: Samples) -> dict[str, object]:
        return {
            "live": {d: sample(s, "jaxmon_memory_live_array_bytes", device=d, **labels) for d in expected["live"]},
            "replicated": {
                d: sample(s, "jaxmon_memory_replicated_array_bytes", device=d, **labels) for d in expected["replicated"]
            },
            "host": {
                d: {k: sample(s, "jaxmon_memory_host_array_bytes", device=d, memory_kind=k, **labels) for k in kinds}
                for d, kinds in expected["host"].items()
            },
        }

    last: list[dict[str, object]] = []

    def matches(s: Samples) -> bool:
        last[:] = [scraped(s)]
        return bool(last[0] == expected)

    # The loop runs on; a poll that lands inside a step sees its temporaries, the next one between steps does not.
    wait_for_samples(url, matches, "placement bytes equal to the loop's arrays", detail=lambda: f"{last} != {expected}")
    assert child.proc.stdin is not None
    child.proc.stdin.close()
    assert child.read_ok()["steps"] > 0
    assert child.proc.wait(30) == 0, child.log()


STRESS = r"""
import faulthandler, os, sys, threading, time
faulthandler.enable()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
import jaxmon.sources.local.workload

want_passes, want_churned = int(sys.argv[1]), int(sys.argv[2])
count = getattr(sys.modules["jaxmon.sources.local.workload"], sys.argv[3])
devices = jax.devices()
mesh = jax.make_mesh((8,), ("d",))
shardings = [
    NamedSharding(mesh, P()),
    NamedSharding(mesh, P("d")),
    SingleDeviceSharding(devices[3]),
    NamedSharding(mesh, P(), memory_kind="pinned_host"),
    SingleDeviceSharding(devices[1], memory_kind="unpinned_host"),
]
donating = jax.jit(lambda a: a + 1, donate_argnums=0)
done = threading.Event()
churned = [0]

def churn():
    # The training thread: arrays made, their shards read (cached on them), deleted or donated, in a tight loop.
    while not done.is_set():
        i = churned[0]
        s = shardings[i % len(shardings)]
        a = jax.device_put(np.ones(64, np.float32), s)
        if i % 3 == 0:
            a.addressable_shards
        if i % 2 == 0 or s.memory_kind != "device":
            a.delete()
        else:
            donating(a).delete()  # a is donated: deleted by the step, not by the loop
        churned[0] = i + 1

for s in shardings[:3]:
    donating(jax.device_put(np.ones(64, np.float32), s)).delete()  # compiled before the race starts
sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: inside the pass, between its calls
t = threading.Thread(target=churn)
t.start()
passes = 0
deadline = time.monotonic() + 120
while (passes < want_passes or churned[0] < want_churned) and t.is_alive() and time.monotonic() < deadline:
    count(jax)
    passes += 1
done.set()
t.join()
print("OK", passes, churned[0], flush=True)
"""


@pytest.mark.parametrize("function", ["array_bytes", "live_array_bytes"])
def test_the_pass_survives_arrays_deleted_and_donated_meanwhile(function: str) -> None:
    """Hundreds of passes while another thread deletes and donates arrays (replicated, sharded, single-device, host)
    as fast as it can: no crash. `is_ready()` on a deleted array segfaults in jaxlib 0.10.2: the pass before issue 34
    called it on each shard (`live_array_bytes`, the memory collector's and the publisher's) and died here at once.
    """
    proc = subprocess.run(
        [sys.executable, "-c", STRESS, "500", "5000", function],
        capture_output=True,
        text=True,
        timeout=300,  # faulthandler in the child: a segfault's stacks are in the failure
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ok, passes, churned = proc.stdout.split()
    assert ok == "OK" and int(passes) >= 500 and int(churned) >= 5000, proc.stdout
