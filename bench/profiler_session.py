"""A profiler session's own start and stop on this machine's devices, ten times over a running jitted program.

    python bench/profiler_session.py

Prints, per mode, (start ms, stop ms, trace KB) for each session: `session` (jaxmon's sample options: no Python
tracer, host tracer level 2), `session-host1` (host tracer level 1), `no-steps` (nothing runs while it traces). XLA's
ProfilerSession is what jaxmon's sampler starts (jaxmon.sources.local.private names it).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from jaxmon.sources.local import private


def main() -> None:
    _, options_type, session_type = private.profiler_internals()
    f = jax.jit(lambda a: jnp.tanh(a @ a))
    size = 4096 if jax.devices()[0].platform == "tpu" else 512  # (a CPU device: a few ms a matmul)
    a = jnp.ones((size, size), jnp.bfloat16)
    f(a).block_until_ready()
    for mode in ("session", "session-host1", "no-steps"):
        out = []
        for _ in range(10):
            options = options_type()
            options.python_tracer_level = 0
            options.host_tracer_level = 1 if mode == "session-host1" else 2
            t = time.perf_counter()
            session = session_type(options)
            start = time.perf_counter() - t
            if mode != "no-steps":
                for _ in range(20):
                    a = f(a)
                a.block_until_ready()
            t = time.perf_counter()
            data = session.stop()
            stop = time.perf_counter() - t
            if mode != "no-steps":
                for _ in range(40):
                    a = f(a)
                a.block_until_ready()
            out.append((round(start * 1e3, 1), round(stop * 1e3, 1), len(data) // 1000))
        print(mode, "start ms, stop ms, KB:", out, flush=True)


if __name__ == "__main__":
    main()
