"""The local source in a real JAX process: reading the workload's live arrays never waits for a step in flight."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT, jaxmon_env

# Two steps in flight when the memory poll reads the live arrays: one running (seconds of matmuls on one thread),
# the next queued behind it, its output buffer not even allocated yet (as a step queued behind a collective that
# waits for a stalled process, forever). Asking a queued output for its buffer pointer waits, holding the GIL, until
# it runs; if live_array_bytes did, the first step would have finished by the time it returned.
PENDING = """
import os
import jax, jax.numpy as jnp
from jaxmon.sources.local.workload import live_array_bytes

@jax.jit
def slow(a, n):  # n matmuls: a trip count known at run time, so one program serves every n
    return jax.lax.fori_loop(0, n, lambda i, b: jnp.tanh(b @ a), a)

x = jnp.ones((1024, 1024), jnp.float32) / 1024  # 4 MiB, ready
slow(x, 1).block_until_ready()  # compiled
running = slow(x, 600)
queued = slow(running, 1)
assert not running.is_ready()
totals = live_array_bytes(jax)
print(running.is_ready(), totals[("cpu", 0)], flush=True)
os._exit(0)  # the answer is in: leave the rest of the matmuls (tens of seconds of CPU) unrun
"""


def test_live_array_bytes_counts_pending_outputs_without_waiting_for_them() -> None:
    env = jaxmon_env({"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}, devices=1)
    result = subprocess.run(
        [sys.executable, "-c", PENDING], capture_output=True, text=True, timeout=90, cwd=ROOT, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    ready, total = result.stdout.split()
    assert ready == "False", "live_array_bytes waited for the step"
    # The input and the two pending outputs, 4 MiB each.
    assert int(total) == 3 * 1024 * 1024 * 4
