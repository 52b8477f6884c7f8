"""The optimizer programs of issue 49 on a ("data", "model") mesh, and the collective bytes their shapes give: imported
by tests/e2e/test_optimizer_programs.py (in its own process) and by tests/workloads/optimizer_job.py (each process
of a 2-process job). Sets nothing in the environment: the importer chose its devices.

- `optax_update`: optax's clip_by_global_norm + adamw applied to tensor-parallel parameters (w1 and b1 split over
  "model" along their hidden dimension, w2 along its rows), a replicated b2 and an embedding split over "data"
  (FSDP). Elementwise but for the global norm: each split leaf's sum of squares is a partial sum, all-reduced over
  the axis it is split on (one f32 each); what XLA spells `mesh[...], device_ids=([2,4]T(1,0)) {'axis_0'}`.
- `flax_step`: a Flax NNX MLP (x @ w1 + b1, relu, @ w2 + b2; w1, b1 and w2 split over "model" as above) trained
  with the same optimizer through nnx.Optimizer on a batch split over "data": the forward all-reduces each device's
  partial (batch / data x DOUT) product over "model", the backward each gradient's local shard (and the loss) over
  "data", and the global norm the three split leaves' partial sums over "model".
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DIN, HID, DOUT, BATCH, VOCAB = 64, 256, 64, 16, 128
F32 = 4
# The leaves split over "model" alone (w1, b1, w2): each adds one f32 partial sum of squares to the global norm.
MODEL_SPLIT_LEAVES = 3


def optimizer() -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))


def expected(program: str, data: int, model: int) -> dict[tuple[str, tuple[str, ...]], int]:
    """Bytes per device and call by (op, mesh axes), from the shapes and the mesh (nccl-tests' convention: an
    all-reduce moves its buffer)."""
    norm = MODEL_SPLIT_LEAVES * F32  # the global norm's partial sums over "model"
    if program == "optax":
        return {("all-reduce", ("model",)): norm, ("all-reduce", ("data",)): F32}  # and the embedding's over "data"
    assert program == "flax", program
    forward = BATCH // data * DOUT * F32
    gradients = (DIN * HID // model + HID // model + HID // model * DOUT + DOUT + 1) * F32  # w1, b1, w2, b2, loss
    return {("all-reduce", ("model",)): forward + norm, ("all-reduce", ("data",)): gradients}


def optax_update(mesh: Mesh) -> tuple[Any, tuple[Any, ...]]:
    """The jitted optimizer update (jax.jit's: `.lower()` too) and its arguments (parameters, optimizer state,
    gradients)."""
    specs = {
        "w1": ((DIN, HID), P(None, "model")),
        "b1": ((HID,), P("model")),
        "w2": ((HID, DOUT), P("model", None)),
        "b2": ((DOUT,), P()),
        "embedding": ((VOCAB, DIN), P("data", None)),
    }
    params = {k: jax.device_put(jnp.ones(shape), NamedSharding(mesh, spec)) for k, (shape, spec) in specs.items()}
    tx = optimizer()
    state = jax.jit(tx.init)(params)

    def update(params: Any, state: Any, grads: Any) -> Any:
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return jax.jit(update), (params, state, params)


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        init, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros_init()
        self.l1 = nnx.Linear(
            DIN, HID, rngs=rngs,
            kernel_init=nnx.with_partitioning(init, (None, "model")),
            bias_init=nnx.with_partitioning(zeros, ("model",)),
        )  # fmt: skip
        self.l2 = nnx.Linear(
            HID, DOUT, rngs=rngs,
            kernel_init=nnx.with_partitioning(init, ("model", None)),
            bias_init=nnx.with_partitioning(zeros, (None,)),
        )  # fmt: skip

    def __call__(self, x: jax.Array) -> jax.Array:
        out: jax.Array = self.l2(jax.nn.relu(self.l1(x)))
        return out


def flax_step(mesh: Mesh) -> tuple[Any, tuple[Any, ...]]:
    """The nnx.jit train step (`.lower()` too) and its arguments (model, optimizer, batch, targets), every array
    global over `mesh` (made inside jit: a mesh over several processes' devices too)."""

    @nnx.jit
    def create() -> tuple[MLP, nnx.Optimizer[MLP]]:
        model = MLP(nnx.Rngs(0))
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        return model, nnx.Optimizer(model, optimizer(), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: MLP, opt: nnx.Optimizer[MLP], x: jax.Array, y: jax.Array) -> jax.Array:
        def loss_fn(model: MLP) -> jax.Array:
            return ((model(x) - y) ** 2).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    with jax.set_mesh(mesh):
        model, opt = create()
    batch = NamedSharding(mesh, P("data"))
    x = jax.make_array_from_callback((BATCH, DIN), batch, lambda index: np.ones((BATCH, DIN), np.float32)[index])
    y = jax.make_array_from_callback((BATCH, DOUT), batch, lambda index: np.zeros((BATCH, DOUT), np.float32)[index])
    return train_step, (model, opt, x, y)
