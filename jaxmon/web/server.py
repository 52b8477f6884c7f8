"""HTTP: a small ASGI app (/metrics, /healthz, /readyz, /) served by hypercorn, bounded and optionally TLS.

prometheus_client's start_http_server has no connection bound or timeouts and runs TLS handshakes in its accept
loop (DESIGN.md section 6). hypercorn runs every connection as an asyncio task: TLS handshakes happen off the
accept path with a timeout, a connection that has not sent complete request headers within the idle timeout is
closed however slowly it trickles bytes (slowloris), and headers are capped at 16 KiB. The app itself answers 503
past --web.max-requests requests in flight.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import html
import logging
import os
import signal
import ssl
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs

import structlog
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from jaxmon.exposition import Exposition
from jaxmon.runtime import Runtime
from jaxmon.settings import Settings, parse_listen_address
from jaxmon.web.webconfig import BasicAuth, WebConfig, WebConfigError, build_ssl_context, load_web_config

log = structlog.get_logger("jaxmon.web.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def accepts_gzip(header: str) -> bool:
    """True when Accept-Encoding allows gzip (`gzip;q=0` refuses it; `*` allows it unless gzip is refused)."""
    allowed: dict[str, bool] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if name:
            allowed[name.strip().lower()] = q > 0
    if "gzip" in allowed:
        return allowed["gzip"]
    return allowed.get("*", False)


class WebState:
    """The live web config: auth, headers and TLS context; re-read when any of its files changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        config = load_web_config(path)
        self.ssl_context: ssl.SSLContext | None = build_ssl_context(config.tls) if config.tls is not None else None
        self._apply(config)

    def _apply(self, config: WebConfig) -> None:
        """Make `config` the live one: auth, headers, and the files to watch."""
        self.config = config
        self.auth = BasicAuth(config.spec.basic_auth_users)
        self.headers = [(k.lower().encode(), v.encode()) for k, v in config.spec.http_server_config.headers.items()]
        self._stamps = self._stat()

    def _stat(self) -> dict[Path, tuple[int, int, int] | None]:
        stamps: dict[Path, tuple[int, int, int] | None] = {}
        for f in self.config.watched_files():
            try:
                st = os.stat(f)
                stamps[f] = (st.st_ino, st.st_mtime_ns, st.st_size)
            except OSError:
                stamps[f] = None
        return stamps

    def reload_if_changed(self) -> bool:
        """Re-read the config when a file changed; a broken edit keeps the last good config. True if applied."""
        if self.path is None or self._stat() == self._stamps:
            return False
        self._stamps = self._stat()  # a broken edit is reported once, not every second
        try:
            fresh = load_web_config(self.path)
        except WebConfigError as exc:
            log.error("web config not reloaded, keeping the last good one", error=str(exc))
            return False
        if (fresh.tls is None) != (self.ssl_context is None):
            log.error("web config: turning TLS on or off needs a restart; other changes applied")
        elif fresh.tls is not None and self.ssl_context is not None:
            build_ssl_context(fresh.tls, self.ssl_context)  # new handshakes use the new certificates
        self._apply(fresh)
        log.info("web config reloaded", file=str(self.path))
        return True


Response = tuple[int, str, bytes, list[tuple[bytes, bytes]]]
TEXT = "text/plain; charset=utf-8"


class App:
    """The ASGI application: GET/HEAD on known paths, 404 elsewhere, 405 for other methods, 503 when full."""

    def __init__(self, runtime: Runtime, telemetry_path: str, web: WebState, max_requests: int) -> None:
        self._runtime = runtime
        self._telemetry_path = telemetry_path
        self._web = web
        self._max_requests = max_requests
        self._in_flight = 0
        self._exposition = Exposition(runtime.snapshot, runtime.collectors)
        self._routes: dict[str, Callable[[Scope], Response]] = {
            telemetry_path: self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/": self._landing,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if self._in_flight >= self._max_requests:
            await self._respond(send, scope, (503, TEXT, b"too many requests in flight\n", []))
            return
        self._in_flight += 1
        try:
            await self._respond(send, scope, await self._handle(scope))
        finally:
            self._in_flight -= 1

    async def _handle(self, scope: Scope) -> Response:
        if self._web.auth.enabled and not await self._authorized(scope):
            return 401, TEXT, b"unauthorized\n", [(b"www-authenticate", b'Basic realm="jaxmon", charset="UTF-8"')]
        route = self._routes.get(scope["path"])
        if route is None:
            return 404, TEXT, b"not found\n", []
        if scope["method"] not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n", [(b"allow", b"GET, HEAD")]
        return route(scope)

    async def _authorized(self, scope: Scope) -> bool:
        header = _header(scope, b"authorization")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        # bcrypt takes tens of milliseconds: keep it off the event loop so other scrapes are not delayed.
        return await asyncio.to_thread(self._web.auth.check, user, password)

    async def _respond(self, send: Send, scope: Scope, response: Response) -> None:
        status, ctype, body, extra = response
        headers = [
            (b"content-type", ctype.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *extra,
            *self._web.headers,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    def _metrics(self, scope: Scope) -> Response:
        want_gzip = accepts_gzip(_header(scope, b"accept-encoding"))
        selected = None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "collect[]" in query:
            # node_exporter's filter: only these collectors' families (and their collector_* series).
            selected = set(query["collect[]"])
            unknown = sorted(selected - self._exposition.names)
            if unknown:
                known = ", ".join(sorted(self._exposition.names))
                return (
                    400,
                    TEXT,
                    f"collect[]: no running collector {', '.join(unknown)} (running: {known})\n".encode(),
                    [],
                )
        body = self._exposition.render(want_gzip, selected)
        extra = [(b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")] if want_gzip else []
        return 200, CONTENT_TYPE_PLAIN_0_0_4, body, extra

    def _healthz(self, scope: Scope) -> Response:
        ok, reason = self._runtime.health()
        return (200 if ok else 503), TEXT, f"{'ok' if ok else 'unhealthy'}: {reason}\n".encode(), []

    def _readyz(self, scope: Scope) -> Response:
        if self._runtime.ready:
            return 200, TEXT, b"ready\n", []
        return 503, TEXT, b"not ready: first poll not complete\n", []

    def _landing(self, scope: Scope) -> Response:
        snap = self._runtime.snapshot()
        backends = "".join(
            f"<li>{html.escape(b.name)}: {'up' if b.up else 'down — ' + html.escape(b.error or '')}</li>"
            for b in snap.backends
        )
        path = html.escape(self._telemetry_path)
        page = (
            "<!doctype html><html><head><title>jaxmon</title></head><body>"
            "<h1>jaxmon</h1><p>Prometheus exporter for JAX devices.</p><ul>"
            f'<li><a href="{path}">{path}</a></li>'
            '<li><a href="/healthz">/healthz</a> (fresh data)</li>'
            '<li><a href="/readyz">/readyz</a> (first poll done)</li></ul>'
            f"<p>{len(snap.devices)} devices from source <code>{html.escape(snap.source)}</code>.</p>"
            f"<h2>Backends</h2><ul>{backends}</ul></body></html>"
        )
        return 200, "text/html; charset=utf-8", page.encode(), []


def _header(scope: Scope, name: bytes) -> str:
    return b", ".join(v for k, v in scope.get("headers", []) if k == name).decode("latin-1")


class _Config(HypercornConfig):
    """hypercorn's config with jaxmon's own (reloadable) TLS context."""

    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__()
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return self._context is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._context


class HttpServer:
    """The bound listener and the app; binding happens here, so a busy port fails at once with OSError."""

    def __init__(self, runtime: Runtime, settings: Settings) -> None:
        self.web = WebState(settings.web.config.file)
        host, port = parse_listen_address(settings.web.listen_address)
        config = _Config(self.web.ssl_context)
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.keep_alive_timeout = settings.web.header_timeout  # also bounds the wait for request headers
        config.read_timeout = int(max(settings.web.header_timeout, 1))
        config.ssl_handshake_timeout = settings.web.header_timeout
        config.h11_max_incomplete_size = 16 * 1024
        config.graceful_timeout = 2.0
        config.include_server_header = False
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        config.alpn_protocols = ["http/1.1"]
        self._config = config
        self._app = App(runtime, settings.web.telemetry_path, self.web, settings.web.max_requests)
        self._sockets = config.create_sockets()
        self.scheme = "https" if self.web.ssl_context is not None else "http"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.started = threading.Event()

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        sockets = self._sockets.secure_sockets or self._sockets.insecure_sockets
        return int(sockets[0].getsockname()[1])

    async def serve(self) -> None:
        """Serve until stop() is called."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        watcher = asyncio.create_task(self._watch_web_config())
        self.started.set()
        try:
            await worker_serve(
                ASGIWrapper(cast(Any, self._app)), self._config, sockets=self._sockets, shutdown_trigger=self._stop.wait
            )
        finally:
            watcher.cancel()

    async def _watch_web_config(self) -> None:
        while self.web.path is not None:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(self.web.reload_if_changed)

    def stop(self) -> None:
        """Ask the server to stop; safe from any thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def close_listener(self) -> None:
        """Close this process's copy of the listening sockets (a forked child, which must not hold the port)."""
        for sock in [*self._sockets.secure_sockets, *self._sockets.insecure_sockets]:
            sock.close()


def serve_until_signalled(runtime: Runtime, server: HttpServer) -> None:
    """Run the HTTP server in this thread until SIGTERM or SIGINT, then stop it and the scheduler."""

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def stop(signame: str) -> None:
            log.info("shutting down", signal=signame)
            server.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        runtime.stop()
