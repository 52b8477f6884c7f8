"""The ASGI application: /metrics, /healthz, /readyz, the landing page, the device memory profile and traces.

GET and HEAD on known paths, 404 elsewhere, 405 for other methods. The web config's rate limit (429) and basic
auth (401) come first, as in exporter-toolkit; a request whose credentials passed recently is answered without
bcrypt, and bcrypt runs on a queue of its own, so unauthenticated peers can neither hold the request slots
(`--web.max-requests`, 503 past it) nor starve the event loop. Where a collector is read at each scrape (the
embedded exporter's prometheus_client default registry: the user's own collectors, waited for up to their
deadline), the exposition is rendered off the event loop too: every other connection, TLS handshake and /healthz
must not wait with it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import html
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import structlog
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from jaxmon.exposition import Exposition
from jaxmon.openmetrics_format import CONTENT_TYPE_LATEST as OPENMETRICS
from jaxmon.openmetrics_format import wants_openmetrics
from jaxmon.runtime import Runtime
from jaxmon.scrapers import TIMEOUT_HEADER, MetricsRequest, deadline, identify
from jaxmon.web.access import CheckQueue
from jaxmon.web.profiling import PPROF_PATH, DeviceMemoryProfiles
from jaxmon.web.reload import WebState
from jaxmon.web.tracing import TRACE_PATH, Traces

_log = structlog.get_logger("jaxmon.web")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Response = tuple[int, str, bytes, list[tuple[bytes, bytes]]]
TEXT = "text/plain; charset=utf-8"
SCRAPE = "jaxmon.scrape"  # the scope's key for what a /metrics request's render read (jaxmon.scrapers.MetricsRequest)


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


def _header(scope: Scope, name: bytes) -> str:
    return b", ".join(v for k, v in scope.get("headers", []) if k == name).decode("latin-1")


def basic_credentials(scope: Scope) -> tuple[str, str] | None:
    """The user and password of an `Authorization: Basic` header, None when there is none or it is malformed."""
    scheme, _, encoded = _header(scope, b"authorization").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


class App:
    """The ASGI application over one runtime."""

    def __init__(
        self,
        runtime: Runtime,
        telemetry_path: str,
        web: WebState,
        max_requests: int,
        enable_profiling: bool = False,
        checks: CheckQueue | None = None,
    ) -> None:
        self._runtime = runtime
        self._telemetry_path = telemetry_path
        self._web = web
        self._max_requests = max_requests
        self._in_flight = 0
        self._checks = checks if checks is not None else CheckQueue()
        self._exposition = Exposition(runtime.snapshot, runtime.collectors, runtime.transform, runtime.last_word)
        self._routes: dict[str, Callable[[Scope], Response]] = {
            telemetry_path: self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/": self._landing,
        }
        # Only a workload process (jaxmon.start) holds device buffers worth profiling.
        self._profiles = DeviceMemoryProfiles(enable_profiling, runtime.in_process)
        self._traces = Traces(enable_profiling, runtime.in_process)

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
        refusal = await self._admit(scope)
        if refusal is not None:
            await self._respond(send, scope, refusal)
            return
        if self._in_flight >= self._max_requests:
            await self._respond(send, scope, (503, TEXT, b"too many requests in flight\n", []))
            return
        self._in_flight += 1
        try:
            response = await self._handle(scope)
            await self._respond(send, scope, response)
            scrape = scope.get(SCRAPE)
            if scrape is not None and response[0] == 200 and scope["method"] == "GET":
                self._exposition.served(scrape)  # handed to the connection whole
        finally:
            self._in_flight -= 1

    async def _admit(self, scope: Scope) -> Response | None:
        """The rate limit, then basic auth (before a request slot is taken); None when the request may go on."""
        if self._web.limiter is not None and not self._web.limiter.allow():
            return 429, TEXT, b"too many requests: rate_limit in the web config\n", []  # before auth, as the toolkit
        auth = self._web.auth
        if not auth.enabled:
            return None
        credentials = basic_credentials(scope)
        if credentials is not None and auth.cached(*credentials):
            return None
        if credentials is not None:
            ok = await self._checks.run(auth.check, *credentials)
            if ok is None:
                return 503, TEXT, b"too many password checks in progress; retry\n", [(b"retry-after", b"1")]
            if ok:
                return None
        return 401, TEXT, b"unauthorized\n", [(b"www-authenticate", b'Basic realm="jaxmon", charset="UTF-8"')]

    async def _handle(self, scope: Scope) -> Response:
        route = self._routes.get(scope["path"])
        debug = scope["path"] in (PPROF_PATH, TRACE_PATH)
        if route is None and not debug:
            return 404, TEXT, b"not found\n", []
        if scope["method"] not in ("GET", "HEAD"):
            return 405, TEXT, b"method not allowed\n", [(b"allow", b"GET, HEAD")]
        if scope["path"] == TRACE_PATH:
            return await self._traces.respond(scope.get("query_string", b""))
        if route is None:
            return await self._profiles.respond()
        if route == self._metrics and self._exposition.waits:
            return await asyncio.to_thread(route, scope)  # off the event loop: it may wait for the user's collectors
        return route(scope)

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

    def close(self) -> None:
        """Stop the password-check thread."""
        self._checks.close()

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
        openmetrics = wants_openmetrics(_header(scope, b"accept"))
        client = scope.get("client") or ("", 0)
        timeout = _header(scope, TIMEOUT_HEADER.encode())
        scrape = scope[SCRAPE] = MetricsRequest(
            identify(str(client[0]), _header(scope, b"user-agent"), timeout), deadline=deadline(timeout)
        )
        try:
            body = self._exposition.render(want_gzip, selected, openmetrics, scrape)
        except ValueError as exc:  # a family OpenMetrics cannot hold (a user's): the text format still can
            if not openmetrics:
                raise
            _log.error("OpenMetrics exposition failed: the text format is served", error=str(exc)[:200])
            openmetrics, body = False, self._exposition.render(want_gzip, selected, scrape=scrape)
        extra = [(b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")] if want_gzip else []
        return 200, OPENMETRICS if openmetrics else CONTENT_TYPE_PLAIN_0_0_4, body, extra

    def _healthz(self, scope: Scope) -> Response:
        ok, reason = self._runtime.health()
        return (200 if ok else 503), TEXT, f"{'ok' if ok else 'unhealthy'}: {reason}\n".encode(), []

    def _readyz(self, scope: Scope) -> Response:
        if self._runtime.ready:
            return 200, TEXT, b"ready\n", []
        return 503, TEXT, b"not ready: first poll not complete\n", []

    def _landing(self, scope: Scope) -> Response:
        return 200, "text/html; charset=utf-8", landing_page(self._runtime, self._telemetry_path, self._profiles), []


def landing_page(runtime: Runtime, telemetry_path: str, profiles: DeviceMemoryProfiles) -> bytes:
    """The page at /: links, version, health, the collectors and their state, the devices and the backends."""
    snap = runtime.snapshot()
    esc = html.escape
    path = esc(telemetry_path)
    ok, reason = runtime.health()
    profiling = (
        f'<li><a href="{PPROF_PATH}">{PPROF_PATH}</a> (live device buffers, pprof)</li>'
        f'<li><a href="{TRACE_PATH}?steps=2">{TRACE_PATH}?steps=2</a> (a trace of two steps, for XProf or '
        "Perfetto)</li>"
        if profiles.available
        else ""
    )
    collectors = "".join(
        f"<li><code>{esc(name)}</code>: "
        + ("ok" if status.success else "<strong>failing</strong> (the log says why)")
        + "</li>"
        for name, status in sorted(snap.statuses.items())
    )
    waiting = sorted({c.name for c in runtime.collectors} - set(snap.statuses))
    collectors += "".join(f"<li><code>{esc(name)}</code>: no update yet</li>" for name in waiting)
    devices = "".join(
        f"<li><code>{esc(d.name)}</code> {esc(d.device_kind)} (process {d.process_index})</li>" for d in snap.devices
    )
    backends = "".join(
        f"<li>{esc(b.name)}: {'up' if b.up else 'down — ' + esc(b.error or '')}</li>" for b in snap.backends
    )
    count = len(snap.devices)
    page = (
        "<!doctype html><html><head><title>jaxmon</title></head><body>"
        f"<h1>jaxmon {esc(snap.build.get('version', ''))}</h1>"
        f"<p>Prometheus exporter for JAX devices (jax {esc(snap.build.get('jax_version', ''))}).</p><ul>"
        f'<li><a href="{path}">{path}</a></li>'
        f'<li><a href="/healthz">/healthz</a> (fresh data): {"ok" if ok else "unhealthy"}: {esc(reason)}</li>'
        f'<li><a href="/readyz">/readyz</a> (first poll done): {"ready" if runtime.ready else "not ready"}</li>'
        f"{profiling}</ul>"
        f"<h2>Collectors</h2><ul>{collectors}</ul>"
        f"<h2>Devices</h2><p>{count} {'device' if count == 1 else 'devices'} from source "
        f"<code>{esc(snap.source)}</code>.</p><ul>{devices}</ul>"
        f"<h2>Backends</h2><ul>{backends}</ul></body></html>"
    )
    return page.encode()
