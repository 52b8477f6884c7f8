"""The daemon's health socket and `jaxmon healthcheck`, the command the image's HEALTHCHECK runs.

`jaxmon serve --health.socket PATH` (the image sets `JAXMON_HEALTH__SOCKET`) answers `GET /healthz` and
`GET /readyz` on a Unix socket as well as on its listener, with the same answers. The socket is made in a
directory only the daemon's uid may enter (0700) and is itself 0600: only that uid (and root) can connect, so it
needs neither TLS nor a password, and it is no way into the exporter for anyone who could not already read its
memory. `jaxmon healthcheck` reads the same settings (`JAXMON_*`, the config file, its own flags) to find the
socket; the listen address and the web config (TLS, client certificates, basic auth) do not matter to it, so
moving or locking down the listener needs no change to the check. DESIGN.md section 14 says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import os
import socket
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the daemon's side only: the check itself loads none of it)
    from jaxmon.runtime import Runtime

# A request head larger than this, or slower than the timeout, is dropped: only the health check talks here.
_MAX_HEAD = 4096
_TIMEOUT = 5.0
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthSocketError(Exception):
    """The health socket cannot be made where the settings say (the message says why and what to do)."""


def bind_health_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600, in a directory of this uid's that only it may enter.

    The directory is made (0700) when missing; one that another uid owns or others may enter is refused, and so is
    anything at `path` but a socket of this uid's (a socket left by a daemon that died is replaced).
    """
    path = Path(path)
    directory = path.parent
    uid = os.getuid()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        raise HealthSocketError(
            f"cannot make the directory {directory}: {exc.strerror or exc} (a read-only file system? mount a tmpfs "
            "there, e.g. docker run --tmpfs /tmp)"
        ) from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a directory"
        raise HealthSocketError(
            f"{directory} is {kind} of uid {st.st_uid} with mode {oct(stat.S_IMODE(st.st_mode))}; the health socket "
            f"needs a directory of uid {uid} that only it may enter (0700): name another with --health.socket"
        )
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(existing.st_mode) or existing.st_uid != uid:
            raise HealthSocketError(f"{path} exists and is not a socket of uid {uid}; remove it or name another path")
        path.unlink()  # left by a daemon that stopped (or is replaced by this one)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)  # the socket is made 0600: no moment when others could connect
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        sock.listen(16)
    except OSError as exc:
        sock.close()
        raise HealthSocketError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


class HealthSocket:
    """/healthz and /readyz of `runtime` on a bound Unix socket, served on the daemon's event loop (so a stuck loop
    fails the check as it fails every scrape)."""

    def __init__(self, runtime: Runtime, path: Path) -> None:
        self.path = Path(path)
        self._runtime = runtime
        self._sock = bind_health_socket(self.path)
        self._inode = os.stat(self.path).st_ino
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Accept connections on the running loop."""
        self._server = await asyncio.start_unix_server(self._handle, sock=self._sock, limit=_MAX_HEAD)

    def close(self) -> None:
        """Stop accepting and remove the socket file (unless another daemon has replaced it since)."""
        if self._server is not None:
            self._server.close()
        self._sock.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                self.path.unlink()

    def answer(self, method: str, target: str) -> tuple[int, str]:
        """The status and body for one request."""
        routes: dict[str, Callable[[], tuple[int, str]]] = {"/healthz": self._healthz, "/readyz": self._readyz}
        route = routes.get(target.split("?", 1)[0])
        if route is None:
            return 404, "not found: this socket serves /healthz and /readyz\n"
        if method not in ("GET", "HEAD"):
            return 405, "method not allowed\n"
        return route()

    def _healthz(self) -> tuple[int, str]:
        ok, reason = self._runtime.health()
        return (200 if ok else 503), f"{'ok' if ok else 'unhealthy'}: {reason}\n"

    def _readyz(self) -> tuple[int, str]:
        if self._runtime.ready:
            return 200, "ready\n"
        return 503, "not ready: first poll not complete\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _TIMEOUT)
            method, target, _version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, body = self.answer(method, target)
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                f"content-length: {len(data)}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else data)
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            pass  # a slow, oversized or malformed request: closed without an answer
        finally:
            writer.close()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self._path))


def probe(path: Path, endpoint: str = "/healthz", timeout: float = 4.0) -> tuple[bool, str]:
    """Ask the daemon at the health socket `path`: (healthy, one line saying why)."""
    connection = _UnixConnection(path, timeout)
    try:
        connection.request("GET", endpoint)
        response = connection.getresponse()
        body = response.read(_MAX_HEAD).decode(errors="replace").strip()
    except FileNotFoundError:
        return False, (
            f"no health socket at {path}: the daemon has not started yet, or could not make it (its log says why), "
            "or it was told another --health.socket (give the check the same one, best as JAXMON_HEALTH__SOCKET)"
        )
    except PermissionError:
        owner = _owner(path)
        return False, (
            f"{path}: permission denied: only the daemon's uid ({owner}) may connect; this check runs as uid "
            f"{os.getuid()}"
        )
    except ConnectionRefusedError:
        return False, f"{path}: nothing listens (the daemon that made it has stopped)"
    except TimeoutError:
        return False, f"{path}: no answer within {timeout:g}s (the daemon is stuck)"
    except (OSError, http.client.HTTPException) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.errno == errno.ENOTSOCK:
            reason = "not a socket"
        return False, f"{path}: {reason}"
    finally:
        connection.close()
    return response.status == 200, f"{endpoint} {response.status}: {body}"


def _owner(path: Path) -> str:
    for candidate in (path, path.parent):
        with contextlib.suppress(OSError):
            return str(os.stat(candidate).st_uid)
    return "?"


def main(argv: Sequence[str]) -> int:
    """`jaxmon healthcheck`: exit 0 when the daemon's /healthz is 200, 1 otherwise (one line on stdout says why),
    2 for settings it cannot use. With no flags and JAXMON_HEALTH__SOCKET set (the image's case), the socket is that
    variable's: no config file or other variable outranks it, so the settings model (about 1 s of CPU to load, every
    30 s within the HEALTHCHECK's 5 s timeout) is not loaded."""
    if not argv and (path := os.environ.get("JAXMON_HEALTH__SOCKET")):
        ok, line = probe(Path(path))
        print(line)
        return 0 if ok else 1
    from jaxmon.compose import load_settings  # the settings model and the collector registry, as `serve` loads them
    from jaxmon.settings import SettingsError

    try:
        settings = load_settings(argv, prog="jaxmon healthcheck")
    except SettingsError as exc:
        print(f"jaxmon healthcheck: {exc}", file=sys.stderr)
        return 2
    if settings.health.socket is None:
        print(
            "jaxmon healthcheck: no health socket is set: the daemon serves one with --health.socket "
            "(JAXMON_HEALTH__SOCKET; the image sets it), and the check reads the same setting",
            file=sys.stderr,
        )
        return 2
    ok, line = probe(settings.health.socket)
    print(line)
    return 0 if ok else 1
