"""Helpers shared by the tests and bench/: child processes, the daemon as a real process, scraping and waiting.

No pytest here: bench/common.py imports this module too (bench scripts are run by hand, outside pytest).
"""

from __future__ import annotations

import ctypes
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from jaxmon.catalog import metrics

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRAIN = Path(__file__).resolve().parent / "workloads" / "train.py"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# pytest-xdist's workers (tests/run.sh runs the suite on two) each take ports from a block of their own, below
# Linux's ephemeral range (32768-60999, where bind(0) and outgoing connections take theirs): a port one worker was
# given is never given to another before it binds it. A worker goes round its block in order.
_PORT_BLOCK = 2000
_PORT_BASE = 20000
_next_port = 0


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        first = _PORT_BASE + (int(worker[2:]) % 6) * _PORT_BLOCK
        for _ in range(_PORT_BLOCK):
            port = first + _next_port % _PORT_BLOCK
            _next_port += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_samples(text: str, declared: bool = True) -> Samples:
    """Every sample of an exposition, keyed by (name, labels). With `declared`, every `jaxmon_` family in it is
    as the metric catalog declares it (jaxmon/catalog/metrics.py): a family or label it lacks fails the test that
    scraped it, whatever it checks (`declared=False` for a user's own families of jaxmon's prefix)."""
    out: Samples = {}
    problems: list[str] = []
    for family in text_string_to_metric_families(text):
        if declared and family.name.startswith("jaxmon_"):
            problems += metrics.undeclared(family.name, family.type, ((s.name, s.labels) for s in family.samples))
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    assert not problems, "the exposition differs from the catalog: " + "; ".join(problems)
    return out


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the series `name` with exactly `labels`, None when absent."""
    return samples.get((name, frozenset(labels.items())))


def per_device(samples: Samples, name: str, platform: str | None = None) -> dict[str, float]:
    """{device label: value} of one per-device series (of one platform: ids repeat across platforms)."""
    out = {}
    for (sample_name, labels), value in samples.items():
        if sample_name == name:
            lab = dict(labels)
            if platform is None or lab.get("platform") == platform:
                out[lab["device"]] = value
    return out


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 10.0,
    what: str = "condition",
    step: float = 0.01,
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Poll `predicate` every `step` s until it holds; after `timeout`, AssertionError naming `what` plus `detail()`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            more = detail()
            raise AssertionError(f"{what} not reached within {timeout}s" + (f":\n{more}" if more else ""))
        time.sleep(step)


def jaxmon_env(extra: Mapping[str, str] | None = None, devices: int = 8) -> dict[str, str]:
    """This environment with N JAX CPU devices (as CI runs the suite), unbuffered output, then `extra`."""
    return {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "PYTHONUNBUFFERED": "1", **(extra or {})}


def text_targets(render: Callable[[int], bytes], count: int, port: int) -> http.server.ThreadingHTTPServer:
    """A loopback HTTP server of `count` scrape targets, not yet serving: /metrics/K answers `render(K)` in the text
    format, 404 past them (synthetic jobs' targets: tests/e2e/test_fleet_tier.py, bench/job_rules_scale.py)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            m = re.fullmatch(r"/metrics/(\d+)", self.path)
            if not m or int(m.group(1)) >= count:
                self.send_error(404)
                return
            body = render(int(m.group(1)))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)


def die_with_parent() -> None:
    """In a child, before it runs its program: SIGKILL it when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a test worker that dies (a crash, a hard timeout) leaves no server behind. Only for
    children started from a thread that lives as long as they do (the signal follows the starting thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def terminate(proc: subprocess.Popen[Any], timeout: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """Send `sig` to a child that still runs, wait up to `timeout`, then SIGKILL; its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Process:
    """A child process with stdout and stderr in its own log file; stop() signals it, then kills it."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path = ROOT) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def log(self) -> str:
        """Everything the process wrote so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send `sig`, wait up to `timeout`, then SIGKILL; the exit status."""
        status = terminate(self.proc, timeout, sig)
        self._log.close()
        return status


class Daemon(Process):
    """`python -m jaxmon serve` as a child process on its own loopback port, logging to `log_dir`."""

    def __init__(
        self,
        log_dir: Path,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        scheme: str = "http",
        client: dict[str, Any] | None = None,
        *,
        name: str = "jaxmon",
        cwd: Path = ROOT,
        python: str = sys.executable,
    ) -> None:
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        # requests keyword arguments for every call: verify (CA file), cert (client cert), auth.
        self.client = client or {}
        argv = [python, "-m", "jaxmon", "serve", "--web.listen-address", f"127.0.0.1:{self.port}", *args]
        super().__init__(argv, log_dir / f"{name}-{self.port}.log", jaxmon_env(env), cwd)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        """GET `path` with the daemon's client settings."""
        return requests.get(self.url + path, **{"timeout": 10, **self.client, **kwargs})

    def status(self, path: str) -> int | None:
        """The status of GET `path`, None while nothing answers."""
        try:
            return self.get(path).status_code
        except (requests.ConnectionError, requests.exceptions.SSLError):
            return None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for /readyz to answer 200; fail at once if the daemon exits."""

        def ready() -> bool:
            if not self.alive():
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            return self.status("/readyz") == 200

        wait_until(ready, timeout, "daemon ready", step=0.05, detail=self.log)

    def scrape(self) -> Samples:
        """One /metrics, parsed."""
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return parse_samples(r.text)

    def wait_for(self, predicate: Callable[[Samples], bool], timeout: float = 60.0, what: str = "condition") -> Samples:
        """Scrape until `predicate(samples)` holds; the samples it held for."""
        return wait_for_samples(self.url, predicate, what, timeout, client=self.client, detail=self.log)


# A client that scrapes as Prometheus does (its User-Agent): it is served the new counter series jaxmon.births holds
# at 0, and frees them; other readers are served their values (jaxmon.scrapers).
AS_PROMETHEUS: dict[str, Any] = {"headers": {"User-Agent": "Prometheus/2.42.0 (jaxmon's tests)"}}


def scrape(url: str, **client: Any) -> Samples:
    """One /metrics of the exporter at `url`, parsed."""
    r = requests.get(url + "/metrics", **{"timeout": 10, **client})
    assert r.status_code == 200, r.text
    return parse_samples(r.text)


def wait_for_samples(
    url: str,
    predicate: Callable[[Samples], bool],
    what: str = "condition",
    timeout: float = 30.0,
    client: Mapping[str, Any] | None = None,
    detail: Callable[[], str] = lambda: "",
) -> Samples:
    """Scrape `url` until `predicate(samples)` holds; the samples it held for."""
    last: list[Samples] = []

    def holds() -> bool:
        last[:] = [scrape(url, **(client or {}))]
        return predicate(last[0])

    wait_until(holds, timeout, what, step=0.1, detail=detail)
    return last[0]


def last_success(samples: Samples, collector: str) -> float:
    """jaxmon_collector_last_success_timestamp_seconds of `collector` (0 before its first success)."""
    return sample(samples, "jaxmon_collector_last_success_timestamp_seconds", collector=collector) or 0.0


def wait_for_fresh_samples(url: str, collector: str, what: str = "", timeout: float = 30.0) -> Samples:
    """Samples from an update of `collector` that started after this call."""
    # Two successes later than now: the first may have read its data before now; a job never overlaps itself, so
    # the second started after the first was recorded.
    since = time.time()
    first = wait_for_samples(url, lambda s: last_success(s, collector) > since, f"a {collector} update {what}", timeout)
    stamp = last_success(first, collector)
    return wait_for_samples(url, lambda s: last_success(s, collector) > stamp, f"another {collector} update", timeout)


def importable() -> str:
    """PYTHONPATH for a child run as a script (`python tests/workloads/x.py`): the checkout first, so that it imports
    `tests.workloads.protocol` as the suite does."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


class Child:
    """tests/workloads/train.py (a JAX training loop with jaxmon embedded or publishing), or another workload
    `script` that answers `OK <json>` lines the same way, driven line by line."""

    def __init__(
        self, tmp: Path, *args: str, env: dict[str, str] | None = None, script: Path = TRAIN, hello: bool = True
    ) -> None:
        """Start it; with `hello`, wait for its first answer (`self.hello`), else call `greet()` later (processes
        of one job that answer only once all of them have started)."""
        self.stderr_path = tmp / f"child-{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=ROOT,
            env={**os.environ, "JAX_NUM_CPU_DEVICES": "8", "PYTHONPATH": importable(), **(env or {})},
        )
        self.hello: dict[str, Any] = self.read_ok() if hello else {}

    def greet(self, timeout: float = 60.0) -> dict[str, Any]:
        """Read the first answer of a child started with `hello=False`."""
        self.hello = self.read_ok(timeout)
        return self.hello

    def read_ok(self, timeout: float = 60.0) -> dict[str, Any]:
        """The next `OK <json>` answer; AssertionError (with the child's stderr) on anything else."""
        stdout = self.proc.stdout
        assert stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        line = result[0] if result else ""
        assert line.startswith("OK "), f"child said {line!r}; stderr:\n{self.log()}"
        return dict(json.loads(line[3:]))

    def send(self, command: str) -> dict[str, Any]:
        """Send one command line and return its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read_ok()

    def log(self) -> str:
        """The child's stderr so far."""
        self._stderr.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        """Kill the child (if it still runs) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._stderr.close()


def promtool() -> str:
    """The path of promtool (Debian package 'prometheus'); AssertionError when it is missing."""
    path = shutil.which("promtool")
    if path is None:
        raise AssertionError("promtool not found: install the Debian package 'prometheus' (.ci/run does)")
    return path
