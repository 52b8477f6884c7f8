"""A Flax NNX + Optax training loop, run as a real child process by tests/e2e/test_docs_loops.py.

The lines between `docs:start` and `docs:end` are docs/training-loops.md's Flax example, word for word
(tests/unit/test_docs_snippets.py holds them equal). jaxmon.start() takes its port and settings from the JAXMON_*
environment the test gives. After the loop it answers `OK <json>` on stdout (the exporter's URL, the loop's figures and
XLA's FLOPs of one step) and waits for a line on stdin before it exits, so that the test can scrape it.
"""

# docs:start
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxmon

jaxmon.start(workload="flax-lm")  # serves :10401/metrics; JAXMON_* variables set the rest

VOCAB, DIM, SEQ, BATCH = 256, 64, 32, 16


class LM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.hidden = nnx.Linear(DIM, DIM, rngs=rngs)
        self.out = nnx.Linear(DIM, VOCAB, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.hidden(self.embed(tokens))))


model = LM(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
n_params = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@jaxmon.track  # optional: XLA's FLOPs of each call, for HFU
@nnx.jit
def train_step(model: LM, optimizer: nnx.Optimizer[LM], batch: jax.Array) -> jax.Array:
    def loss_fn(model: LM) -> jax.Array:
        logits = model(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss  # not yet computed: jaxmon's waiter sees when it is


rng = np.random.default_rng(0)
previous = None
for n in range(500):
    batch = jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ + 1)))  # your data loader's batch
    loss = train_step(model, optimizer, batch)
    jaxmon.step(n, loss, examples=BATCH, tokens=BATCH * SEQ, model_flops=6 * n_params * BATCH * SEQ)
    jax.block_until_ready(previous)  # wait for the step before: at most two steps in flight
    previous = loss
# docs:end

# The test's side (not in the docs): what the loop did, then wait to be scraped.
flops = train_step.lower(model, optimizer, batch).compile().cost_analysis()["flops"]
exporter = jaxmon.start()  # the running exporter
figures = {"steps": 500, "batch": BATCH, "seq": SEQ, "n_params": int(n_params), "flops": float(flops)}
print("OK " + __import__("json").dumps({"url": exporter.url, "loss": float(loss), **figures}), flush=True)
input()
exporter.stop()
