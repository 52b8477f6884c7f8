"""Shared fixtures: the daemon as a real process, scraped over HTTP on loopback; probe threads end with their test.

The helpers themselves live in tests/helpers.py (bench/ uses them too); the names other test files import from
here are re-exported.
"""

from __future__ import annotations

import os

# JAX's 8 CPU devices for every test, however pytest is started (tests/run.sh sets it too); here, before any test
# module or deeper conftest imports jax (tests/unit/training/conftest.py does): JAX reads it as it is imported.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from jaxmon.cli import main
from jaxmon.logsetup import route_to_stdlib_logging
from tests.helpers import (
    FIXTURES,
    ROOT,
    Child,
    Daemon,
    Samples,
    free_port,
    parse_samples,
    promtool,
    sample,
    wait_until,
)

__all__ = [
    "CLI",
    "FIXTURES",
    "ROOT",
    "Daemon",
    "Samples",
    "StartDaemon",
    "free_port",
    "parse_samples",
    "promtool",
    "sample",
    "sidecar_args",
    "wait_until",
]


def pytest_configure(config: pytest.Config) -> None:
    """In-process jaxmon events (the probe's, from its own threads) go to stdlib logging, which pytest captures
    per test and shows under "Captured log" of a failing test; unconfigured structlog prints to stdout."""
    route_to_stdlib_logging(cache_loggers=False)  # structlog.testing.capture_logs must still see every logger


# The end-to-end files that run longest, mostly waiting on what they drive (container engines building and starting
# images, a real 4-process job in a real Prometheus over minutes): under pytest-xdist (tests/run.sh: pytest -n 2)
# they are one group, first in the collection order, run by one worker while the other goes through the rest. xdist's
# scope scheduler then hands the groups out by their number of tests, most first (--loadscope-reorder, its default):
# the long lane's 30 tests start after eight unit files of 32-96 tests, seconds into the run. One group also keeps
# test_container.py and test_container_engines.py on one worker, so that Docker's image build, started by the first,
# runs beside its tests (tests/e2e/conftest.py). Every other file is a group of its own: its module fixtures are made
# once, on one worker.
LONG_LANE = (
    "tests/e2e/test_container.py",
    "tests/e2e/test_container_engines.py",
    "tests/e2e/test_job_view.py",
    "tests/e2e/test_fleet_tier.py",  # three Prometheus servers waiting out the fleet rules' windows: half a minute
    "tests/e2e/test_prometheus_truth.py",  # three runs of a training loop under a real Prometheus: about a minute
    "tests/e2e/test_churn.py",  # jobs that crash, restart and end, under real Prometheus servers: about a minute
)


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "long-lane" if path in LONG_LANE else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long lane's tests first (a stable sort: each file keeps its order)."""
    items.sort(key=lambda item: _group(item.nodeid) != "long-lane")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadfile` (tests/run.sh), xdist's scope scheduler with the groups above as its scopes
    (xdist_group marks would do it, but xdist 3.8 marks them in the node id in a way pytest 9.2 no longer reads).
    Other --dist modes are xdist's own (the unit command's `load` spreads single tests)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class FileGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return FileGroups(config, log)


def sidecar_args(spool: Path, poll: str = "0.2s") -> list[str]:
    """The arguments of a spool sidecar reading `spool` every `poll`, without the probe."""
    return ["--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", poll]


# start_daemon(*args, env=None, ready=True, scheme="http", client=None) -> Daemon
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


# Every process a test session starts (a daemon, a workload, Prometheus, Alertmanager, the children of those) inherits
# this variable with the session's own value (each xdist worker its own), so that the session can find those still
# alive at its end, wherever they were reparented.
# Not JAXMON_*: a daemon warns of each JAXMON_* variable that sets nothing (test_daemon_logging.py reads its first
# line).
SESSION_MARK = "PYTEST_JAXMON_SESSION"
# How long the end of the session waits for processes that are stopping (a SIGTERM just sent) to be gone.
LEFTOVER_GRACE = 15.0


def session_processes(mark: str) -> dict[int, str]:
    """The live processes (not zombies) whose environment carries `SESSION_MARK=mark`, with their command lines."""
    found: dict[int, str] = {}
    needle = f"{SESSION_MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if state != "Z":
            found[int(entry.name)] = command
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_session() -> Iterator[None]:
    """The run fails when a process the session started is still alive at its end (after a grace for those being
    stopped); they are killed then, so that the next run starts clean."""
    mark = f"{os.getpid()}-{time.time_ns()}"
    os.environ[SESSION_MARK] = mark
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = session_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = session_processes(mark)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "processes the test session started outlive it (killed now): " + "; ".join(
        f"{pid}: {command[:200]}" for pid, command in sorted(left.items())
    )


def _probe_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("jaxmon-probe-")}


@pytest.fixture(autouse=True)
def no_probe_thread_outlives_its_test() -> Iterator[None]:
    """Every probe worker a test starts has ended when the test is torn down (stop() and join() were called)."""
    before = _probe_threads()
    yield
    left = _probe_threads() - before
    # A worker ends after its current task; give a thread that is finishing one a moment.
    for thread in left:
        thread.join(2.0)
    alive = sorted(t.name for t in left if t.is_alive())
    assert not alive, f"probe worker threads outlive the test: {alive}"


TOUCHED_LOGGERS = ("apscheduler", "apscheduler.scheduler", "jax", "hypercorn.error", "hypercorn.access")


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Workload child processes (tests/workloads) a test starts: each closed after it."""
    started: list[Child] = []
    yield started
    for c in started:
        c.close()


@pytest.fixture
def no_jaxmon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JAXMON_* variable of the developer's shell reaches the settings the test loads."""
    for name in list(os.environ):
        if name.startswith("JAXMON_"):
            monkeypatch.delenv(name)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put back the root handlers and level, the loggers configure_logging touches, and structlog's config."""
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    named = {
        name: (list(lg.handlers), list(lg.filters), lg.level, lg.propagate)
        for name, lg in ((n, logging.getLogger(n)) for n in TOUCHED_LOGGERS)
    }
    config = structlog.get_config()
    config["processors"] = list(config["processors"])
    yield
    root.handlers[:] = root_handlers
    root.setLevel(root_level)
    for name, (handlers, filters, level, propagate) in named.items():
        lg = logging.getLogger(name)
        lg.handlers[:] = handlers
        lg.filters[:] = filters
        lg.setLevel(level)
        lg.propagate = propagate
    structlog.reset_defaults()
    structlog.configure(**config)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], restore_logging: None) -> Iterator[CLI]:
    """Run `jaxmon ARGV` in this process; logging (which the CLI configures) is put back afterwards."""
    yield CLI(capsys)


class CLI:
    """`jaxmon ARGV` as the console script runs it: the exit status, stdout and stderr."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self._capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse exits itself (unknown flags, --help), as the console script would
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = self._capsys.readouterr()
        return code, out, err
