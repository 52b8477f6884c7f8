"""Connection-level behaviour under hypercorn: junk gets a 400 at once, status lines carry their reason phrase, and
accept errors are logged once a second.

jaxmon runs hypercorn's own per-connection server (hypercorn/asyncio/tcp_server.py TCPServer) behind its own
listeners instead of hypercorn's worker_serve, for one reason: to look at the first bytes of a connection before
h11 does. h11 only judges a request line once the whole head has arrived (h11/_readers.py
maybe_read_from_IDLE_client waits for the blank line), so an HTTP/0.9 `GET /` or random bytes without a blank line
sat until the header timeout (5 s) instead of being answered. The same place adds the reason phrase that h11 leaves
empty when hypercorn builds a response (`HTTP/1.1 200 ` -> `HTTP/1.1 200 OK`; RFC 9112 4 allows either, but
people and older clients read it).
"""

from __future__ import annotations

import asyncio
import errno
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from socket import socket
from typing import Any, cast

import structlog
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from hypercorn.typing import AppWrapper

log = structlog.get_logger("jaxmon.web.connections")

_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]")
_VERSION_PREFIX = re.compile(rb"(H(T(T(P(/([0-9](\.([0-9])?)?)?)?)?)?)?)?")
_MAX_METHOD = 24  # longer than any registered method (IANA's longest is 17 characters)
# Bytes that make h11 refuse a request line at once (it refuses a first byte below 0x21 without waiting for more,
# h11/_receivebuffer.py is_next_line_obviously_invalid_request_line); hypercorn then answers 400 and closes.
_REFUSE = b" "


def first_line_verdict(head: bytes) -> bool | None:
    """True when `head` starts with a well-formed HTTP/1.x request line, False when it cannot, None: too early."""
    if not head:
        return None
    end = head.find(b"\n")
    line = head if end < 0 else head[:end].removesuffix(b"\r")
    complete = end >= 0
    method, sp1, rest = line.partition(b" ")
    if not all(c in _TCHAR for c in method) or len(method) > _MAX_METHOD:
        return False
    if not sp1:
        return False if complete else None
    if not method:
        return False
    target, sp2, version = rest.partition(b" ")
    if any(c <= 0x20 or c == 0x7F for c in target):
        return False
    if not sp2:
        return False if complete else None
    if not target:
        return False
    if complete:
        return _VERSION.fullmatch(version) is not None
    return None if _VERSION_PREFIX.fullmatch(version) else False


class FirstRequestGuard:
    """A StreamReader view for TCPServer that holds the first bytes back until they can start a request line.

    Junk is replaced by a byte h11 refuses at once, so hypercorn answers its usual 400 and closes; a good
    request line is passed on whole, and after it everything flows through untouched.
    """

    def __init__(self, reader: asyncio.StreamReader, limit: int) -> None:
        self._reader = reader
        self._limit = limit
        self._held = b""
        self._checking = True

    def at_eof(self) -> bool:
        """As the reader's, while nothing is held back."""
        return not self._held and self._reader.at_eof()

    async def read(self, n: int = -1) -> bytes:
        """The next bytes for h11."""
        if not self._checking:
            if self._held:
                held, self._held = self._held, b""
                return held
            return await self._reader.read(n)
        while True:
            data = await self._reader.read(n)
            if not data:  # the peer closed: let h11 judge what there is
                self._checking = False
                held, self._held = self._held, b""
                return held
            self._held += data
            verdict = first_line_verdict(self._held[: self._limit])
            if verdict is None and len(self._held) < self._limit:
                continue
            self._checking = False
            if verdict is False:
                self._held = b""
                return _REFUSE
            held, self._held = self._held, b""
            return held


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) \r\n")


class ReasonPhrases:
    """A StreamWriter view that writes each response's status line with its reason phrase.

    hypercorn hands h11's output over one event at a time, so a response head is one `write` that starts with the
    status line (hypercorn/protocol/h11.py `_send_h11_event`); bodies are separate writes.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        """Write `data`, with the reason phrase put into a status line that lacks one."""
        match = _STATUS_LINE.match(data)
        if match is not None:
            try:
                phrase = HTTPStatus(int(match.group(1))).phrase.encode()
            except ValueError:  # a code with no registered phrase stays as it is
                phrase = b""
            data = data[: match.end() - 2] + phrase + data[match.end() - 2 :]
        self._writer.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class AcceptErrorThrottle:
    """An event-loop exception handler that turns asyncio's accept-error flood into one line a second.

    On EMFILE and friends asyncio logs a traceback for every try and retries `backlog` times per wakeup
    (asyncio/selector_events.py _accept_connection, CPython 3.11-3.13): thousands of tracebacks a second when the
    descriptor limit is reached. Here they are counted and logged at most once per `interval`, with the count.
    """

    ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.total = 0
        self._clock = clock
        self._unlogged = 0
        self._last: float | None = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in self.ERRNOS and "socket" in context):
            loop.default_exception_handler(context)
            return
        self.total += 1
        self._unlogged += 1
        now = self._clock()
        if self._last is None or now - self._last >= self.interval:
            log.error(
                "cannot accept connections, retrying",
                error=f"{errno.errorcode.get(exc.errno or 0, '?')}: {exc.strerror}",
                errors_since_last_report=self._unlogged,
                errors_total=self.total,
                hint="raise the open-file limit (ulimit -n) or lower --web.max-requests / idle connections",
            )
            self._unlogged = 0
            self._last = now


async def serve(
    app: AppWrapper,
    config: Config,
    insecure: list[socket],
    secure: list[socket],
    context: ssl.SSLContext | None,
    shutdown: Callable[[], Awaitable[Any]],
) -> None:
    """Serve `app` on the sockets until `shutdown()` returns, then give connections the graceful timeout."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptErrorThrottle())
    worker = WorkerContext(None)
    tasks: set[asyncio.Task[None]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            tasks.add(cast("asyncio.Task[None]", task))
            task.add_done_callback(tasks.discard)
        guard = FirstRequestGuard(reader, config.h11_max_incomplete_size)
        out = cast(asyncio.StreamWriter, ReasonPhrases(writer))
        await TCPServer(app, loop, config, worker, {}, cast(asyncio.StreamReader, guard), out)

    servers = [
        await asyncio.start_server(
            connection, sock=s, backlog=config.backlog, ssl=context, ssl_handshake_timeout=config.ssl_handshake_timeout
        )
        for s in secure
    ] + [await asyncio.start_server(connection, sock=s, backlog=config.backlog) for s in insecure]
    try:
        await shutdown()
    finally:
        await worker.terminated.set()
        for server in servers:
            server.close()
        for server in servers:
            await server.wait_closed()
        if tasks:
            await asyncio.wait(list(tasks), timeout=config.graceful_timeout)
