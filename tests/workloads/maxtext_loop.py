"""A MaxText-style training loop (a jitted, donated step under a device mesh, shardings constrained with bare
`PartitionSpec`s, optax), run as a real child process by tests/e2e/test_docs_loops.py.

The lines between `docs:start` and `docs:end` are docs/training-loops.md's MaxText-style example, word for word
(tests/unit/test_docs_snippets.py holds them equal). jaxmon.start() takes its port and settings from the JAXMON_*
environment the test gives. After the loop it answers `OK <json>` on stdout (the exporter's URL, the loop's figures,
XLA's FLOPs of one step read in the loop's mesh context, and whether the step lowers outside it) and waits for a line
on stdin before it exits, so that the test can scrape it.
"""

# docs:start
import functools

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmon

jaxmon.start(workload="maxtext-style")

VOCAB, DIM, HIDDEN, SEQ = 512, 128, 512, 64
BATCH = 8 * jax.local_device_count()  # this process's share of the global batch
mesh = Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "model"))
specs = {"embed": P(None, "model"), "w_in": P(None, "model"), "w_out": P("model", None)}
Params = dict[str, jax.Array]


def init(key: jax.Array) -> Params:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k1, (VOCAB, DIM)) * 0.02,
        "w_in": jax.random.normal(k2, (DIM, HIDDEN)) * DIM**-0.5,
        "w_out": jax.random.normal(k3, (HIDDEN, DIM)) * HIDDEN**-0.5,
    }


def loss_fn(params: Params, tokens: jax.Array) -> jax.Array:
    x = jax.lax.with_sharding_constraint(params["embed"][tokens[:, :-1]], P("data", None, None))  # the context's mesh
    h = jax.lax.with_sharding_constraint(jax.nn.relu(x @ params["w_in"]), P("data", None, "model"))
    logits = (h @ params["w_out"]) @ params["embed"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


optimizer = optax.adamw(1e-3)
State = tuple[Params, optax.OptState]


@jaxmon.track  # XLA's FLOPs per device, read on this thread in the loop's mesh context
@functools.partial(jax.jit, donate_argnums=0)
def train_step(state: State, tokens: jax.Array) -> tuple[State, dict[str, jax.Array]]:
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": loss}


with jax.set_mesh(mesh):
    params = jax.jit(init, out_shardings={k: NamedSharding(mesh, s) for k, s in specs.items()})(jax.random.key(0))
    state = (params, optimizer.init(params))
    n_params = sum(p.size for p in jax.tree.leaves(params))
    global_batch = BATCH * jax.process_count()  # the job's figures, the same in every process
    rng = np.random.default_rng(jax.process_index())
    previous = None
    for n in range(50):
        local = rng.integers(0, VOCAB, (BATCH, SEQ + 1))  # your data loader's batch
        tokens = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
        state, metrics = train_step(state, tokens)  # the old state is donated: never hand it to step()
        flops = 6 * n_params * global_batch * SEQ
        jaxmon.step(n, metrics["loss"], examples=global_batch, tokens=global_batch * SEQ, model_flops=flops)
        jax.block_until_ready(previous)  # at most two steps in flight (a collective on CPU devices needs it)
        previous = metrics["loss"]
# docs:end

# The test's side (not in the docs): what the loop did, then wait to be scraped.
with jax.set_mesh(mesh):
    step_flops = train_step.lower(state, tokens).compile().cost_analysis()["flops"]
try:
    train_step.lower(state, tokens)
    lowers_outside = True
except Exception:
    lowers_outside = False
exporter = jaxmon.start()  # the running exporter
figures = {"steps": 50, "batch": BATCH, "seq": SEQ, "n_params": int(n_params), "flops": float(step_flops)}
answer = {"url": exporter.url, "lowers_outside_mesh": lowers_outside, **figures}
print("OK " + __import__("json").dumps(answer), flush=True)
input()
exporter.stop()
