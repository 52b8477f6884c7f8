"""HTTP: a small ASGI app (/metrics, /healthz, /readyz, /) served by uvicorn with a concurrency limit."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import html
import signal
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import structlog
import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from jaxmon.collector import SnapshotCollector
from jaxmon.runtime import Runtime
from jaxmon.settings import Settings, parse_listen_address

log = structlog.get_logger("jaxmon.server")

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


class Exposition:
    """The rendered /metrics body, rebuilt only when the snapshot changed (scrapes never touch devices)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(SnapshotCollector(runtime.snapshot))
        self._version = -1
        self._plain = b""
        self._gzipped: bytes | None = None

    def render(self, want_gzip: bool) -> bytes:
        """The exposition for the current snapshot, gzip-compressed when asked."""
        version = self._runtime.version
        if version != self._version:
            self._plain = generate_latest(self._registry)
            self._gzipped = None
            self._version = version
        if not want_gzip:
            return self._plain
        if self._gzipped is None:
            self._gzipped = gzip.compress(self._plain, compresslevel=5)
        return self._gzipped


class App:
    """The ASGI application: GET/HEAD on known paths, 404 elsewhere, 405 for other methods."""

    def __init__(self, runtime: Runtime, telemetry_path: str) -> None:
        self._runtime = runtime
        self._telemetry_path = telemetry_path
        self._exposition = Exposition(runtime)
        self._routes: dict[str, Callable[[Scope], tuple[int, str, bytes, list[tuple[bytes, bytes]]]]] = {
            telemetry_path: self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/": self._landing,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        route = self._routes.get(scope["path"])
        method = scope["method"]
        extra: list[tuple[bytes, bytes]] = []
        if route is None:
            status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
        elif method not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain; charset=utf-8", b"method not allowed\n"
            extra = [(b"allow", b"GET, HEAD")]
        else:
            status, ctype, body, extra = route(scope)
        headers = [
            (b"content-type", ctype.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *extra,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

    def _metrics(self, scope: Scope) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
        accept = b""
        for name, value in scope.get("headers", []):
            if name == b"accept-encoding":
                accept += value
        want_gzip = accepts_gzip(accept.decode("latin-1"))
        body = self._exposition.render(want_gzip)
        extra = [(b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")] if want_gzip else []
        return 200, CONTENT_TYPE_PLAIN_0_0_4, body, extra

    def _healthz(self, scope: Scope) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
        ok, reason = self._runtime.health()
        return (
            (200 if ok else 503),
            "text/plain; charset=utf-8",
            f"{'ok' if ok else 'unhealthy'}: {reason}\n".encode(),
            [],
        )

    def _readyz(self, scope: Scope) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
        if self._runtime.ready:
            return 200, "text/plain; charset=utf-8", b"ready\n", []
        return 503, "text/plain; charset=utf-8", b"not ready: first poll not complete\n", []

    def _landing(self, scope: Scope) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
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


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: jaxmon exits 0 on SIGTERM (uvicorn re-raises the signal)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def make_server(runtime: Runtime, settings: Settings) -> _Server:
    """A uvicorn server for the app, bounded: 503 past --web.max-requests, small headers, short keep-alive."""
    host, port = parse_listen_address(settings.web.listen_address)
    config = uvicorn.Config(
        App(runtime, settings.web.telemetry_path),
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        limit_concurrency=settings.web.max_requests,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=2,
        h11_max_incomplete_event_size=16 * 1024,
    )
    return _Server(config)


def serve_until_signalled(runtime: Runtime, settings: Settings) -> None:
    """Run the HTTP server in this thread until SIGTERM or SIGINT, then stop it and the scheduler."""
    server = make_server(runtime, settings)

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def stop(signame: str) -> None:
            log.info("shutting down", signal=signame)
            server.should_exit = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        runtime.stop()
    if not server.started:
        raise RuntimeError(f"could not serve on {settings.web.listen_address}")
