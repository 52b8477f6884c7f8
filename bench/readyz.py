"""Start to first ready /readyz on CPU (8 JAX CPU devices), repeated; median.

    .venv/bin/python bench/readyz.py               # about 1 minute

Each run starts `jaxmon serve` at its defaults and polls /readyz every 10 ms; the time from Popen to the first
200 (the first memory poll has landed) is one sample. The time to the first answer of any kind (the port is
served) and, for scale, the time of `python -c "import jax; jax.devices()"` alone are measured in the same
loop, alternating. Target: <= 5 s.
"""

from __future__ import annotations

import argparse
import subprocess
import time

from common import PY, Jaxmon, base_env, median, running, save, status

IMPORT_JAX = "import jax; jax.devices()"


def one_start() -> tuple[float, float]:
    daemon = Jaxmon(name="readyz")
    first_answer = None
    with running(daemon):
        while True:
            code = status(daemon.url, "/readyz")
            now = time.monotonic() - daemon.started
            if code is not None and first_answer is None:
                first_answer = now
            if code == 200:
                return first_answer or now, now
            if not daemon.alive() or now > 120:
                raise RuntimeError(daemon.log()[-2000:])
            time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    ready, served, jax_only = [], [], []
    for i in range(args.repeat):
        first, done = one_start()
        served.append(first)
        ready.append(done)
        t0 = time.monotonic()
        subprocess.run([PY, "-c", IMPORT_JAX], env=base_env(), check=True, capture_output=True)
        jax_only.append(time.monotonic() - t0)
        print(f"run {i}: port answers {first:.2f} s, ready {done:.2f} s; import jax + devices {jax_only[-1]:.2f} s")
    med = median(ready)
    print(
        f"median start to ready {med:.2f} s (port {median(served):.2f} s; JAX alone {median(jax_only):.2f} s)"
        f" -> {'met' if med <= 5 else 'MISSED'}"
    )
    save(
        "readyz",
        {
            "command": "python bench/readyz.py",
            "ready_s": ready,
            "port_answers_s": served,
            "import_jax_s": jax_only,
            "median_ready_s": med,
            "met": med <= 5,
        },
    )


if __name__ == "__main__":
    main()
