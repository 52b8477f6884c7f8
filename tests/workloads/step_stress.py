"""A training loop that tries to break jaxmon's waiter (issue 33), run as a real child by tests/e2e/test_step_stress.py.

Usage: step_stress.py PORT STEPS SEED

Under faulthandler (a crash prints every thread's stack), on 8 CPU devices, with jaxmon.start() on PORT at a fast
poll, it runs STEPS steps of a small sharded program whose state is donated to the next step, and hands each to
jaxmon.step() with ready arrays and figures that it then deletes, donates or reuses at random moments: right away,
a few steps later, or never; some deleted before step() is called; device scalars as token counts and step numbers;
some figures invalid (NaN, negative, a string). At most two steps are in flight (it waits for step n-2), as the
docs' loops do. Then it waits until jaxmon's queue is empty, scrapes its own /metrics and prints one line `OK
<json>`: what it handed (the truth the test checks the exposition against), and the exposition. Exit 0 unless it
crashes (then faulthandler's stacks are on stderr).
"""

from __future__ import annotations

import faulthandler

faulthandler.enable()

import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from typing import Any  # noqa: E402

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import jaxmon  # noqa: E402
import jaxmon.training  # noqa: E402

TOKENS = 128  # the token count every step's device scalar computes (the batch's elements)


def main() -> None:
    port, steps, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    exporter = jaxmon.start(port, workload="stress", poll={"interval": 0.1})
    tracker = jaxmon.training.current()
    assert tracker is not None
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharded = NamedSharding(mesh, PartitionSpec("d"))
    # The state is donated to the next step: whatever still refers to the old one (a ready tree jaxmon holds) sees
    # a donated buffer. Elementwise only: no collective, so many programs in flight cannot starve a rendezvous.
    train = jax.jit(lambda w, x: (w * 0.999 + x * 1e-3, w * x), donate_argnums=0)
    count = jax.jit(lambda x: jnp.sum(x > -1e9))  # TOKENS, on one device, after the batch is computed
    scratch = jax.jit(lambda x: x * 2.0)
    consume = jax.jit(lambda a: a + 1.0, donate_argnums=0)  # donates an array handed to step() earlier
    w = jax.device_put(jnp.zeros(TOKENS), sharded)
    batch = jax.device_put(jnp.ones(TOKENS), sharded)
    host_batch = jnp.ones(TOKENS)  # on device 0
    later: list[tuple[int, Any]] = []  # (step at which to delete it, array)
    inflight: list[Any] = []
    truth = {"handed": 0, "unbooked": 0, "invalid": 0, "lost_before": 0, "at_risk": 0, "tokens_kept": 0}
    for n in range(steps):
        w, out = train(w, batch)  # the previous w is donated here
        tokens = count(host_batch)
        kind = rng.randrange(8)
        ready: tuple[Any, ...]
        risky = True  # a ready array of this step may be deleted or donated before jaxmon waits on it
        if kind == 0:
            ready, risky = (out,), False  # kept: out is never deleted
        elif kind == 1:
            ready = (w,)  # the new state: donated by the next step
        elif kind == 2:
            tmp = scratch(out)
            ready = ({"loss": out, "metrics": [tmp]},)
            later.append((n + rng.randrange(3), tmp))
        elif kind == 3:
            tmp = scratch(out)
            tmp.delete()  # deleted before step(): certainly unready
            ready = (tmp, out)
            truth["lost_before"] += 1
        elif kind == 4:
            ready, risky = (n, {"lr": 1e-3}), False  # host numbers only: the barrier
        elif kind == 5:
            ready, risky = (), False
        elif kind == 6:
            tmp = scratch(out)
            ready = (tmp,)
            later.append((n, tmp))  # deleted or donated right after step()
        else:
            ready = (out, out, out)  # the same array three times (reused)
            risky = False
        truth["at_risk"] += risky
        number: Any = n
        deleted_number = False
        if rng.random() < 0.1:
            number = jnp.int32(n) + 0  # a device step number (a TrainState's step)
            if rng.random() < 0.2:
                number.delete()  # cannot be read: the step is not booked
                deleted_number = True
        figure = rng.random()
        examples: Any = 4
        model_flops: Any = np.float32(1e6)
        bad = False
        if figure < 0.05:
            examples, bad = float("nan"), True
        elif figure < 0.08:
            model_flops, bad = "big", True
        elif figure < 0.1:
            examples, bad = -4, True
        truth["unbooked"] += deleted_number
        truth["invalid"] += bad
        jaxmon.step(number, *ready, examples=examples, tokens=tokens, model_flops=model_flops)
        truth["handed"] += 1
        if rng.random() < 0.3:
            tokens.delete()  # the figure may be read already, or not: booked or unread
        else:
            truth["tokens_kept"] += not deleted_number
        # Deletions and donations due now, at a random point of the loop.
        due = [a for at, a in later if at <= n]
        later = [(at, a) for at, a in later if at > n]
        for a in due:
            if rng.random() < 0.5:
                a.delete()
            else:
                consume(a)  # donated
        inflight.append(out)
        if len(inflight) > 2:
            inflight.pop(0).block_until_ready()  # two steps in flight at most
        if rng.random() < 0.05:
            time.sleep(rng.random() * 0.002)  # let the waiter catch up, or not
    jax.block_until_ready(w)
    deadline = time.monotonic() + 120
    # Until the waiter has taken every step off its queue (its own emptiness, not a count it could get wrong).
    while tracker.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    text = ""
    for _ in range(2):  # a counter series first seen reads 0 until a scrape has served it (born at zero): twice
        time.sleep(0.5)  # a poll after the last booking (after the first scrape): the snapshot is the final one
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            text = response.read().decode()
    exporter.stop()
    print("OK " + json.dumps({**truth, "tokens_per_step": TOKENS, "exposition": text}), flush=True)


if __name__ == "__main__":
    main()
