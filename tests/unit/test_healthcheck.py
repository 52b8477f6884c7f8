"""The daemon's health socket (jaxmon/healthcheck.py) served in-process on an event loop of its own, and
`jaxmon healthcheck` (the image's HEALTHCHECK) asking it; the real daemon and the image: tests/e2e/test_deploy.py
and tests/e2e/test_container.py."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from jaxmon.healthcheck import HealthSocket, HealthSocketError, bind_health_socket, probe
from jaxmon.runtime import Runtime
from tests.conftest import CLI

pytestmark = pytest.mark.usefixtures("no_jaxmon_env")


@dataclass
class FakeRuntime:
    """What the socket reads of a runtime: health() and ready."""

    healthy: bool = True
    reason: str = "last update: memory 0.5s ago"
    ready: bool = True

    def health(self) -> tuple[bool, str]:
        return self.healthy, self.reason


Serve = Callable[[FakeRuntime], HealthSocket]


@pytest.fixture
def short_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a short path (a Unix socket's path has at most 107 bytes)."""
    return tmp_path_factory.mktemp("hc")


@pytest.fixture
def serve(short_dir: Path) -> Iterator[Serve]:
    """Serve a HealthSocket at short_dir/run/health.sock on a loop in a thread, as the daemon serves it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    served: list[HealthSocket] = []

    def start(runtime: FakeRuntime) -> HealthSocket:
        health = HealthSocket(cast(Runtime, runtime), short_dir / "run" / "health.sock")
        asyncio.run_coroutine_threadsafe(health.start(), loop).result(timeout=10)
        served.append(health)
        return health

    yield start
    for health in served:
        loop.call_soon_threadsafe(health.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def _raw(path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(request)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_socket_is_0600_in_a_0700_directory_of_the_daemons_uid(serve: Serve) -> None:
    health = serve(FakeRuntime())
    directory = os.stat(health.path.parent)
    sock = os.stat(health.path)
    assert stat.S_ISDIR(directory.st_mode) and stat.S_IMODE(directory.st_mode) == 0o700
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    assert directory.st_uid == sock.st_uid == os.getuid()


def test_healthz_and_readyz_answer_as_the_runtime_says(serve: Serve) -> None:
    runtime = FakeRuntime()
    health = serve(runtime)
    assert probe(health.path) == (True, "/healthz 200: ok: last update: memory 0.5s ago")
    assert probe(health.path, "/readyz") == (True, "/readyz 200: ready")
    runtime.healthy, runtime.reason = False, "last memory update completed 12.0s ago (limit 2s)"
    assert probe(health.path) == (False, "/healthz 503: unhealthy: last memory update completed 12.0s ago (limit 2s)")
    runtime.ready = False
    assert probe(health.path, "/readyz") == (False, "/readyz 503: not ready: first poll not complete")


def test_only_healthz_and_readyz_are_served_and_only_to_get_and_head(serve: Serve) -> None:
    health = serve(FakeRuntime())
    assert _raw(health.path, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert _raw(health.path, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    head = _raw(health.path, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    # Junk and an oversized head are closed without an answer; the socket serves on.
    assert _raw(health.path, b"junk\r\n\r\n") == b""
    assert _raw(health.path, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 8192 + b"\r\n\r\n") == b""
    assert probe(health.path)[0]


def test_closing_removes_the_socket_and_the_check_then_says_nothing_listens(serve: Serve, short_dir: Path) -> None:
    health = serve(FakeRuntime())
    path = health.path
    health.close()
    assert not path.exists()
    ok, line = probe(path)
    assert not ok and line.startswith(f"no health socket at {path}: the daemon has not started yet")
    # A socket left by a daemon that was killed: nothing listens on it.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    assert probe(path) == (False, f"{path}: nothing listens (the daemon that made it has stopped)")


def test_a_socket_left_by_a_dead_daemon_is_replaced(short_dir: Path) -> None:
    path = short_dir / "run" / "health.sock"
    path.parent.mkdir(mode=0o700)
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()
    sock = bind_health_socket(path)
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert sock.getsockname() == str(path)
    finally:
        sock.close()


def test_a_directory_others_may_enter_or_a_file_in_the_sockets_place_is_refused(short_dir: Path) -> None:
    shared = short_dir / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp or the spool directory: anyone could swap the socket
    with pytest.raises(HealthSocketError, match=r"shared is a directory of uid \d+ with mode 0o1777; the health"):
        bind_health_socket(shared / "health.sock")
    private = short_dir / "private"
    private.mkdir(mode=0o700)
    (private / "health.sock").write_text("not a socket")
    with pytest.raises(HealthSocketError, match=r"health\.sock exists and is not a socket of uid"):
        bind_health_socket(private / "health.sock")
    assert (private / "health.sock").read_text() == "not a socket"
    (short_dir / "file").write_text("")
    with pytest.raises(HealthSocketError, match="cannot make the directory"):
        bind_health_socket(short_dir / "file" / "sub" / "health.sock")


def test_healthcheck_command_reads_the_socket_from_the_daemons_variable_and_ignores_the_listener(
    serve: Serve, cli: CLI, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    health = serve(runtime)
    monkeypatch.setenv("JAXMON_HEALTH__SOCKET", str(health.path))
    # The daemon's listener settings are not read: a moved address and a web config with TLS and basic auth change
    # nothing for the check.
    monkeypatch.setenv("JAXMON_WEB__LISTEN_ADDRESS", "127.0.0.1:10477")
    monkeypatch.setenv("JAXMON_WEB__CONFIG__FILE", str(tmp_path / "web.yml"))
    assert cli("healthcheck") == (0, "/healthz 200: ok: last update: memory 0.5s ago\n", "")
    runtime.healthy, runtime.reason = False, "scheduler is not running"
    assert cli("healthcheck") == (1, "/healthz 503: unhealthy: scheduler is not running\n", "")
    # The daemon's flags work too (for a --health-cmd that passes them).
    monkeypatch.delenv("JAXMON_HEALTH__SOCKET")
    runtime.healthy = True
    assert cli("healthcheck", "--health.socket", str(health.path))[0] == 0


def test_healthcheck_command_says_what_is_wrong(cli: CLI, monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> None:
    code, out, err = cli("healthcheck")
    assert (code, out) == (2, "")
    assert err.startswith("jaxmon healthcheck: no health socket is set: the daemon serves one with --health.socket")
    code, out, err = cli("healthcheck", "--health.sokcet", "/x")
    assert code == 2 and "--health.sokcet" in err and "--health.socket" in err
    monkeypatch.setenv("JAXMON_HEALTH__SOCKET", str(short_dir / "none" / "health.sock"))
    code, out, _ = cli("healthcheck")
    assert code == 1 and out.startswith(f"no health socket at {short_dir / 'none' / 'health.sock'}: ")
    assert "JAXMON_HEALTH__SOCKET" in out


def test_usage_lists_healthcheck(cli: CLI) -> None:
    code, out, _ = cli("--help")
    assert code == 0 and out.startswith("usage: jaxmon {serve,snapshot,top,healthcheck}")
    assert "  healthcheck  " in out
