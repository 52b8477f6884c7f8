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
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs

import structlog
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from jaxmon.exposition import Exposition
from jaxmon.runtime import Runtime
from jaxmon.settings import Settings, parse_listen_address
from jaxmon.web.access import BasicAuth, RateLimiter
from jaxmon.web.connections import serve as serve_connections
from jaxmon.web.profiling import PPROF_PATH, DeviceMemoryProfiles
from jaxmon.web.tls import LiveContext, ServerContext, build_context, live_context
from jaxmon.web.webconfig import WebConfig, WebConfigError, load_web_config

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
    """The live web config: auth, headers, rate limit and TLS context; re-read when a file changes or on SIGHUP.

    A reload that fails, or that would turn TLS, basic auth, client-certificate checks or the SAN check off, keeps
    the last good config and logs an error: a half-written or emptied file must never open the exporter up.
    Loosening takes a restart.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        config = load_web_config(path)
        self.ssl_context: LiveContext | None = live_context(build_context(config.tls)) if config.tls else None
        self.limiter: RateLimiter | None = None
        self._reloading = threading.Lock()  # the file watcher and SIGHUP may ask at once
        self._apply(config, self.ssl_context.current if self.ssl_context else None)

    def _apply(self, config: WebConfig, context: ServerContext | None) -> None:
        """Make `config` the live one: TLS context, auth, headers, rate limit, and the files to watch."""
        if self.ssl_context is not None and context is not None:
            self.ssl_context.current = context  # new handshakes use a context built from scratch
        self.config = config
        self.auth = BasicAuth(config.users)
        self.headers = [(k.lower().encode(), v.encode()) for k, v in config.headers.items()]
        if config.rate_limit is None:
            self.limiter = None
        elif self.limiter is None or self.limiter.limit != config.rate_limit:
            self.limiter = RateLimiter(config.rate_limit)
        for note in config.notes:
            log.warning("web config applied in part", note=note)
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
        """Reload when the config file or a file it names changed. True if a new config was applied."""
        if self.path is None or self._stat() == self._stamps:
            return False
        return self.reload("file changed")

    def reload(self, reason: str) -> bool:
        """Re-read the config now; a broken or loosening edit keeps the last good config. True if applied."""
        if self.path is None:
            log.info("no web config file to reload", reason=reason)
            return False
        with self._reloading:
            return self._reload(reason)

    def _reload(self, reason: str) -> bool:
        assert self.path is not None
        self._stamps = self._stat()  # a broken edit is reported once, not every second
        try:
            fresh = load_web_config(self.path)
            refusal = loosening(self.config, fresh)
            context = build_context(fresh.tls) if fresh.tls is not None else None
        except WebConfigError as exc:
            refusal = str(exc)
        if refusal is not None:
            log.error("web config not reloaded, keeping the last good one", error=refusal, reason=reason)
            return False
        self._apply(fresh, context)
        log.info("web config reloaded", file=str(self.path), reason=reason)
        return True


def loosening(live: WebConfig, fresh: WebConfig) -> str | None:
    """Why `fresh` may not replace `live` without a restart (it turns protection off, or TLS on); None if it may."""
    if live.tls is not None and fresh.tls is None:
        return "the new file turns TLS off; restart jaxmon to serve plain HTTP"
    if live.tls is None and fresh.tls is not None:
        return "the new file turns TLS on, which needs a restart"
    if live.users and not fresh.users:
        return "the new file turns basic auth off (no basic_auth_users); restart jaxmon to serve without auth"
    if live.tls is not None and fresh.tls is not None:
        if live.tls.client_auth == "RequireAndVerifyClientCert" != fresh.tls.client_auth:
            return f"the new file stops requiring client certificates ({fresh.tls.client_auth}); restart to do that"
        if live.tls.allowed_sans is not None and fresh.tls.allowed_sans is None:
            return "the new file stops checking client_allowed_sans; restart jaxmon to do that"
    return None


Response = tuple[int, str, bytes, list[tuple[bytes, bytes]]]
TEXT = "text/plain; charset=utf-8"


class App:
    """The ASGI application: GET/HEAD on known paths, 404 elsewhere, 405 for other methods, 503 when full."""

    def __init__(
        self,
        runtime: Runtime,
        telemetry_path: str,
        web: WebState,
        max_requests: int,
        enable_profiling: bool = False,
    ) -> None:
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
        # Only a workload process (jaxmon.start) holds device buffers worth profiling.
        self._profiles = DeviceMemoryProfiles(enable_profiling, runtime.ctx.in_process)

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
        if self._web.limiter is not None and not self._web.limiter.allow():
            return 429, TEXT, b"too many requests: rate_limit in the web config\n", []  # before auth, as the toolkit
        if self._web.auth.enabled and not await self._authorized(scope):
            return 401, TEXT, b"unauthorized\n", [(b"www-authenticate", b'Basic realm="jaxmon", charset="UTF-8"')]
        route = self._routes.get(scope["path"])
        profile = scope["path"] == PPROF_PATH
        if route is None and not profile:
            return 404, TEXT, b"not found\n", []
        if scope["method"] not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n", [(b"allow", b"GET, HEAD")]
        if route is None:
            return await self._profiles.respond()
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
        profiling = (
            f'<li><a href="{PPROF_PATH}">{PPROF_PATH}</a> (live device buffers, pprof)</li>'
            if self._profiles.available
            else ""
        )
        page = (
            "<!doctype html><html><head><title>jaxmon</title></head><body>"
            "<h1>jaxmon</h1><p>Prometheus exporter for JAX devices.</p><ul>"
            f'<li><a href="{path}">{path}</a></li>'
            '<li><a href="/healthz">/healthz</a> (fresh data)</li>'
            '<li><a href="/readyz">/readyz</a> (first poll done)</li>'
            f"{profiling}</ul>"
            f"<p>{len(snap.devices)} devices from source <code>{html.escape(snap.source)}</code>.</p>"
            f"<h2>Backends</h2><ul>{backends}</ul></body></html>"
        )
        return 200, "text/html; charset=utf-8", page.encode(), []


def _header(scope: Scope, name: bytes) -> str:
    return b", ".join(v for k, v in scope.get("headers", []) if k == name).decode("latin-1")


class HttpServer:
    """The bound listener and the app; binding happens here, so a busy port fails at once with OSError."""

    def __init__(self, runtime: Runtime, settings: Settings) -> None:
        self.web = WebState(settings.web.config.file)
        host, port = parse_listen_address(settings.web.listen_address)
        config = HypercornConfig()
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
        self._app = App(
            runtime, settings.web.telemetry_path, self.web, settings.web.max_requests, settings.web.enable_profiling
        )
        self._sockets = config.create_sockets()
        for sock in self._sockets.insecure_sockets:
            # Listen now (asyncio would only at start_server): from here a connection waits in the backlog
            # instead of being refused, so "serving" is true as soon as it is logged.
            sock.listen(config.backlog)
        if self.web.ssl_context is not None:
            # hypercorn makes TLS sockets only when its config names certificate files; ours come from the web
            # config, so the plain sockets it bound are served with the live context.
            self._secure, self._insecure = self._sockets.insecure_sockets, []
        else:
            self._secure, self._insecure = [], self._sockets.insecure_sockets
        self.scheme = "https" if self.web.ssl_context is not None else "http"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.started = threading.Event()

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return int((self._secure or self._insecure)[0].getsockname()[1])

    async def serve(self) -> None:
        """Serve until stop() is called."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        watcher = asyncio.create_task(self._watch_web_config())
        self.started.set()
        try:
            await serve_connections(
                ASGIWrapper(cast(Any, self._app)),
                self._config,
                self._insecure,
                self._secure,
                self.web.ssl_context,
                self._stop.wait,
            )
        finally:
            watcher.cancel()

    async def _watch_web_config(self) -> None:
        while self.web.path is not None:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(self.web.reload_if_changed)

    async def reload_web_config(self, reason: str) -> None:
        """Re-read the web config now (SIGHUP), off the event loop."""
        await asyncio.to_thread(self.web.reload, reason)

    def stop(self) -> None:
        """Ask the server to stop; safe from any thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def close_listener(self) -> None:
        """Close this process's copy of the listening sockets (a forked child, which must not hold the port)."""
        for sock in [*self._sockets.secure_sockets, *self._sockets.insecure_sockets]:
            sock.close()


def hold_signals_until_serving() -> None:
    """Ignore SIGHUP and SIGUSR1 until serve_until_signalled handles them, so neither kills a starting daemon."""
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def serve_until_signalled(runtime: Runtime, server: HttpServer) -> None:
    """Run the HTTP server in this thread until SIGTERM or SIGINT, then stop it and the scheduler.

    SIGHUP re-reads the web config at once (as Prometheus reloads its config); SIGUSR1 is logged and ignored.
    """

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()

        def stop(signame: str) -> None:
            log.info("shutting down", signal=signame)
            server.stop()

        def reload() -> None:
            log.info("reloading the web config", signal="SIGHUP")
            task = loop.create_task(server.reload_web_config("SIGHUP"))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        def ignore() -> None:
            log.info("signal ignored", signal="SIGUSR1")

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, reload)
        loop.add_signal_handler(signal.SIGUSR1, ignore)
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        runtime.stop()
