"""A Keras 3 callback (JAX backend) that reports each training step to jaxmon, keeping Keras's async dispatch.

    import os
    os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import jaxmon
    from jaxmon.keras import JaxmonCallback

    jaxmon.start(9400, workload="my-job")  # or jaxmon.publish("/run/jaxmon", workload="my-job")
    model.fit(x, y, batch_size=256, epochs=3, callbacks=[JaxmonCallback()])

Each step is `jaxmon.step(n, logs, examples=...)` on the training thread, right after Keras dispatched it: `n` is the
optimizer's step number (a second `fit()` numbers on), `logs` the step's loss and metrics as the step returned them
(JAX arrays not yet computed: the step is complete when they are), `examples` the batch's leading dimension (times
`jax.process_count()`: the job's global batch, each process feeding its own equal share), or `examples=` given to
the callback. `tokens_per_example=` adds `tokens`, `model_flops_per_example=` adds `model_flops`.

Why not `on_train_batch_end`: Keras's CallbackList turns the logs into Python floats (`pythonify_logs`) before any
callback sees them, on the training thread (a sync every step) or, with `async_safe`, on an executor thread, where
the step is complete by then and several batches' callbacks run at once. So the callback wraps the model's
`train_function` from `on_train_begin` to `on_train_end`, and defines no batch hook: Keras keeps async dispatch
(`async_safe = True` says so too), and nothing here waits for a step. With `steps_per_execution` k > 1, one jaxmon
step is one execution (k batches, numbered optimizer step / k).

Only the JAX backend: with another one the callback raises at `fit()`. `import jaxmon` does not import Keras; only
`import jaxmon.keras` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import keras

import jaxmon
from jaxmon import training

TrainFunction = Callable[[Any, Any], Any]


class _Batches:
    """The iterator `train_function` reads batches from, counting the examples of each batch it hands out."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self.examples = 0

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        for leaf in keras.tree.flatten(batch):
            shape = getattr(leaf, "shape", None)
            if shape:  # metadata only: never reads the array
                self.examples += int(shape[0])
                break
        return batch


class _Reporting:
    """The model's train function, reporting each call (one step, or one execution of k) to jaxmon.step()."""

    def __init__(self, callback: JaxmonCallback, inner: TrainFunction, first: int) -> None:
        self.callback = callback
        self.inner = inner
        self.next = first

    def __call__(self, state: Any, batches: Iterator[Any]) -> Any:
        counted = _Batches(batches)
        logs, state = self.inner(state, counted)
        self.callback._report(self.next, logs, counted.examples)
        self.next += 1
        return logs, state


class JaxmonCallback(keras.callbacks.Callback):  # type: ignore[misc]  # keras ships no types
    """Report every training step of `model.fit()` to jaxmon (see the module's docstring)."""

    # Keras keeps dispatching steps asynchronously with this callback (it defines no batch-end hook either).
    async_safe = True

    def __init__(
        self,
        *,
        examples: float | None = None,
        tokens_per_example: float | None = None,
        model_flops_per_example: float | None = None,
    ) -> None:
        """`examples`: the job's examples per step (default: each batch's leading dimension x process count);
        `tokens_per_example`, `model_flops_per_example`: step(tokens=, model_flops=) as that many per example."""
        super().__init__()
        self.examples = examples
        self.tokens_per_example = tokens_per_example
        self.model_flops_per_example = model_flops_per_example
        self._installed: _Reporting | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Wrap the train function Keras made for this fit (it is made before this is called)."""
        backend = keras.backend.backend()
        if backend != "jax":
            raise RuntimeError(f"jaxmon.keras.JaxmonCallback needs the JAX backend (KERAS_BACKEND=jax), not {backend}")
        model = self.model
        inner = model.train_function
        if isinstance(inner, _Reporting):  # a fit that raised left it installed
            inner = inner.inner
        per_call = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)
        self._installed = _Reporting(self, inner, self._optimizer_step(model) // per_call)
        model.train_function = self._installed

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """The fit stops stepping a while (its epoch's end): jaxmon looks at the last step now, so that the steps
        Keras dispatched ahead are dated when they complete (jaxmon.training's pause)."""
        tracker = training.current()
        if tracker is not None:
            tracker.pause()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Give the model its own train function back (the last epoch's end looked at its last step)."""
        if self._installed is not None and self.model.train_function is self._installed:
            self.model.train_function = self._installed.inner
        self._installed = None

    @staticmethod
    def _optimizer_step(model: Any) -> int:
        """The optimizer's step count before this fit (its variables are on the model between fits): the number
        of the first step this fit reports."""
        try:
            return int(model.optimizer.iterations.value)
        except Exception:  # no optimizer built yet: numbering starts at 0
            return 0

    def _report(self, n: int, logs: Any, batch_examples: int) -> None:
        tracker = training.current()  # JAX's process count through jaxmon's own JAX side (None: not started)
        processes = tracker.ops.process_count() if tracker is not None else 1
        examples = self.examples if self.examples is not None else float(batch_examples * processes)
        tokens = examples * self.tokens_per_example if self.tokens_per_example is not None else None
        flops = examples * self.model_flops_per_example if self.model_flops_per_example is not None else None
        jaxmon.step(n, logs, examples=examples, tokens=tokens, model_flops=flops)


__all__ = ["JaxmonCallback"]
