"""Shared fixtures: the daemon as a real process, scraped over HTTP on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import structlog
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """In-process jaxmon events (the probe's, from its own threads) go to stdlib logging, which pytest captures
    per test and shows under "Captured log" of a failing test; unconfigured structlog prints to stdout."""
    structlog.configure(
        processors=[
            structlog.stdlib.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # structlog.testing.capture_logs must still see every logger
    )


FIXTURES = Path(__file__).resolve().parent / "fixtures"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by (name, labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class Daemon:
    """`python -m jaxmon serve` as a child process with its own port and log file."""

    def __init__(
        self,
        tmp: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        scheme: str = "http",
        client: dict[str, Any] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        # requests keyword arguments for every call: verify (CA file), cert (client cert), auth.
        self.client = client or {}
        self.log_path = tmp / f"jaxmon-{self.port}.log"
        full_env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jaxmon",
                "serve",
                "--web.listen-address",
                f"127.0.0.1:{self.port}",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=ROOT,
        )

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.url + path, **{"timeout": 10, **self.client, **kwargs})

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.get("/readyz").status_code == 200:
                    return
            except (requests.ConnectionError, requests.exceptions.SSLError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"daemon not ready within {timeout}s:\n{self.log()}")

    def scrape(self) -> Samples:
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return parse_samples(r.text)

    def wait_for(self, predicate: Callable[[Samples], bool], timeout: float = 60.0, what: str = "condition") -> Samples:
        """Scrape until `predicate(samples)` holds."""
        deadline = time.monotonic() + timeout
        samples: Samples = {}
        while time.monotonic() < deadline:
            samples = self.scrape()
            if predicate(samples):
                return samples
            time.sleep(0.2)
        raise AssertionError(f"{what} not reached within {timeout}s; log:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


StartDaemon = Callable[..., Daemon]


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[StartDaemon]:
    started: list[Daemon] = []

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        ready: bool = True,
        scheme: str = "http",
        client: dict[str, Any] | None = None,
    ) -> Daemon:
        d = Daemon(tmp_path, list(args), env, scheme, client)
        started.append(d)
        if ready:
            d.wait_ready()
        return d

    yield start
    for d in started:
        d.stop(signal.SIGKILL)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        raise AssertionError("promtool not found: install the Debian package 'prometheus' (.ci/run does)")
    return path
