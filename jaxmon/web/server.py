"""HTTP: the bound listeners and the ASGI app (`web/asgi.py`), served by hypercorn, bounded and optionally TLS.

prometheus_client's start_http_server has no connection bound or timeouts and runs TLS handshakes in its accept
loop (DESIGN.md section 6). hypercorn runs every connection as an asyncio task: TLS handshakes happen off the
accept path with a timeout, a connection that has not sent complete request headers within the idle timeout is
closed however slowly it trickles bytes (slowloris), and headers are capped at 16 KiB.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any, cast

from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig

from jaxmon.healthcheck import HealthSocket
from jaxmon.runtime import Runtime
from jaxmon.settings import Settings, parse_listen_address
from jaxmon.web.asgi import App
from jaxmon.web.connections import serve as serve_connections
from jaxmon.web.reload import WebState


class HttpServer:
    """The bound listener and the app; binding happens here, so a busy port fails at once with OSError."""

    def __init__(self, runtime: Runtime, settings: Settings, health: HealthSocket | None = None) -> None:
        self.web = WebState(settings.web.config.file)
        self._health = health  # /healthz on a Unix socket too (`jaxmon serve --health.socket`), served with the rest
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
        self._host, self._telemetry_path = host, settings.web.telemetry_path
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

    @property
    def metrics_url(self) -> str:
        """Where to scrape: the listen address as a URL (all interfaces shown as this host's name)."""
        host = self._host if self._host not in ("0.0.0.0", "::", "") else socket.gethostname()
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{self.port}{self._telemetry_path}"

    async def serve(self) -> None:
        """Serve until stop() is called."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        watcher = asyncio.create_task(self._watch_web_config())
        if self._health is not None:
            await self._health.start()
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
            self._app.close()
            if self._health is not None:
                self._health.close()

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
