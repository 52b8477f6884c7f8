"""Shared helpers for the benchmark scripts: start the daemon, scrape it, read /proc, run wrk, record results.

Not a benchmark itself. Every script in bench/ is run from the repository root as `.venv/bin/python bench/NAME.py`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the helpers the tests use: tests/helpers.py (bench/ runs outside pytest)

from tests.helpers import (  # noqa: E402
    Daemon,
    Process,
    Samples,
    free_port,
    jaxmon_env,
    parse_samples,
    per_device,
    wait_until,
)

__all__ = ["Samples", "free_port", "parse_samples", "per_device"]

BENCH = ROOT / "bench"
RESULTS = Path(os.environ.get("JAXMON_BENCH_RESULTS", BENCH / "results")).resolve()
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def base_env(devices: int = 8, **extra: str) -> dict[str, str]:
    """The environment every child gets: N JAX CPU devices (as the tests run the daemon), unbuffered output."""
    return jaxmon_env(extra, devices)


def run_code(code: str, env: dict[str, str], tree: Path | None) -> dict[str, Any]:
    """Run `code` in a child with this checkout's jaxmon, or with `tree`'s (an older commit's, for a before/after
    comparison); its last line of output is JSON holding `jaxmon` (the jaxmon it imported, checked here)."""
    env = {**env, "PATH": "/usr/bin:/bin"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree or ROOT, capture_output=True, text=True, check=True
    )
    data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    expected = (tree or ROOT) / "jaxmon" / "__init__.py"
    assert Path(data["jaxmon"]) == expected, f"the child imported {data['jaxmon']}, not {expected}"
    return data


def mlp_step(layers: int) -> Any:
    """A fresh MLP training step of `layers` square weights (its own function object: nothing cached from another
    round), taking (params, x) and returning the new params. JAX is imported here: most benches must not."""
    import jax
    import jax.numpy as jnp

    def loss(params: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in params:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    def step(params: list[jax.Array], x: jax.Array) -> list[jax.Array]:
        grads = jax.grad(loss)(params, x)
        return [w - 0.01 * g for w, g in zip(params, grads, strict=True)]

    return step


class Child(Process):
    """A child process logging to bench/results/NAME.log; stopped with SIGTERM, then SIGKILL."""

    def __init__(
        self, argv: Sequence[str], env: dict[str, str] | None = None, name: str = "child", cwd: Path = ROOT
    ) -> None:
        super().__init__(argv, RESULTS / f"{name}.log", env or base_env(), cwd)


class Jaxmon(Daemon):
    """tests/helpers.py's Daemon logging to bench/results/NAME-PORT.log; `tree` runs another checkout's jaxmon."""

    def __init__(
        self,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        name: str = "jaxmon",
        tree: Path | None = None,
    ) -> None:
        env = dict(env or base_env())
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        super().__init__(RESULTS, list(args), env, name=name, cwd=tree or ROOT)


class Baseline(Child):
    """bench/baseline_exporter.py: the plain prometheus_client exporter doing the same job."""

    def __init__(self, args: Sequence[str] = (), env: dict[str, str] | None = None, name: str = "baseline") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([PY, str(BENCH / "baseline_exporter.py"), "--port", str(self.port), *args], env, name)


def get(url: str, path: str = "/metrics", headers: dict[str, str] | None = None, timeout: float = 10.0) -> bytes:
    """One GET on a fresh connection; raises on a non-200 answer."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status}")
        return body
    finally:
        conn.close()


def status(url: str, path: str) -> int | None:
    """The status of GET path, None when nothing answers."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return None
    finally:
        conn.close()


def wait_ready(child: Process, url: str, path: str = "/readyz", timeout: float = 120.0, step: float = 0.01) -> float:
    """Seconds from the child's start to the first 200 on `path`."""

    def ready() -> bool:
        if not child.alive():
            raise RuntimeError(f"{child.log_path.name} exited:\n{child.log()[-3000:]}")
        return status(url, path) == 200

    wait_until(ready, timeout, f"{path} 200", step, detail=lambda: child.log()[-3000:])
    return time.monotonic() - child.started


def scrape(url: str) -> Samples:
    return parse_samples(get(url).decode())


def wait_for(url: str, predicate: Any, timeout: float = 120.0, what: str = "condition") -> Samples:
    """Scrape `url` until `predicate(samples)` holds (a daemon not answering yet is not an error)."""
    last: list[Samples] = []

    def holds() -> bool:
        try:
            last[:] = [scrape(url)]
        except (OSError, RuntimeError):
            return False
        return bool(predicate(last[0]))

    wait_until(holds, timeout, what, step=0.25)
    return last[0]


def all_calibrated(devices: int = 8, platform: str | None = "cpu") -> Any:
    """Predicate: every device answers the probe (jaxmon_device_up), and every probed device has a step count
    (calibration done) and one completed run. CPU devices are probed once per process (cpu:0 for all) unless
    --collector.probe.each-cpu-device; an older jaxmon probed each."""

    def check(s: Samples) -> bool:
        probed = per_device(s, "jaxmon_probe_steps", platform)
        return (
            len(per_device(s, "jaxmon_device_up", platform)) >= devices
            and bool(probed)
            and set(probed) <= set(per_device(s, "jaxmon_probe_duration_seconds", platform))
        )

    return check


# -- /proc ---------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def sched_seconds(pid: int) -> float:
    """CPU time of the process's live threads from /proc/PID/task/*/schedstat (nanosecond resolution; a thread
    that exits takes its time with it, so use it beside cpu_seconds, not instead)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS (bytes), VmHWM (bytes) and Threads of a process."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
        elif key == "Threads":
            out[key] = int(value)
    return out


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- wrk -----------------------------------------------------------------------------------------------------

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(url: str, duration: int, connections: int, threads: int = 1, headers: Sequence[str] = ()) -> dict[str, float]:
    """One wrk run: requests/s, latency percentiles (s), errors."""
    exe = shutil.which("wrk")
    if exe is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    argv = [exe, f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "--timeout", "10s"]
    for h in headers:
        argv += ["-H", h]
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = {"errors": 0.0, "non_2xx": 0.0}
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"(50|75|90|99)%\s+(\S+)", line)
        if m:
            result[f"p{m.group(1)}"] = _seconds(m.group(2))
        elif line.startswith("Requests/sec:"):
            result["rps"] = float(line.split()[1])
        elif line.startswith("Socket errors:"):
            result["errors"] = float(sum(int(n) for n in re.findall(r"\d+", line)))
        elif line.startswith("Non-2xx"):
            result["non_2xx"] = float(line.split()[-1])
        elif re.match(r"\d+ requests in", line):
            result["requests"] = float(line.split()[0])
    return result


# -- results -------------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def machine() -> dict[str, Any]:
    """The machine and software a figure was measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.splitlines()
    versions = {}
    for dist in ("jax", "jaxlib", "prometheus-client", "hypercorn", "jaxmon"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "missing"
    load = os.getloadavg()
    gpu = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        gpu = smi.stdout.strip() or smi.stderr.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem[1].split()[1] if len(mem) > 1 else "unknown",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "gpu": gpu,
        **versions,
    }


def save(name: str, result: dict[str, Any]) -> Path:
    """Write bench/results/NAME.json (with the machine) and print it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"benchmark": name, "machine": machine(), **result}
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    print(json.dumps(doc, indent=2))
    print(f"written {path}")
    return path


@contextlib.contextmanager
def running(*children: Child) -> Iterator[None]:
    """Stop every child on the way out, whatever happens."""
    try:
        yield
    finally:
        for c in children:
            c.stop()


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
