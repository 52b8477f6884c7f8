"""`jaxmon top`'s fetching: /metrics and /healthz of each endpoint, on a thread each, so none can freeze the screen."""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.client import HTTPException
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from jaxmon.top.rows import (
    ProcessRow,
    Row,
    RowKey,
    Scrape,
    ScrapeError,
    down_rows,
    parse_exposition,
    recent_step_times,
)

DEFAULT_URL = "http://localhost:10401/metrics"
# A jaxmon exposition is a few hundred KiB at most; a peer sending more is not one.
MAX_BODY_BYTES = 64 << 20


class EndpointError(ValueError):
    """An endpoint URL that cannot be scraped."""


def metrics_url(raw: str) -> str:
    """A full metrics URL from what a person types: `host:port`, `http://host:port`, or the whole URL."""
    text = raw.strip()
    bare = "://" not in text  # `host` or `host:port`: jaxmon's port unless one is given
    if bare:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise EndpointError(f"{raw!r}: scheme must be http or https, not {parts.scheme!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise EndpointError(f"{raw!r}: {exc}") from exc
    if not parts.hostname:
        raise EndpointError(f"{raw!r}: no host")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    netloc = f"{parts.netloc}:10401" if bare and port is None else parts.netloc
    return urlunsplit((parts.scheme, netloc, path, parts.query, ""))


def healthz_url(metrics: str) -> str:
    """/healthz of the daemon serving `metrics` (the server answers it at the root whatever the telemetry path)."""
    parts = urlsplit(metrics)
    return urlunsplit((parts.scheme, parts.netloc, "/healthz", "", ""))


def display_name(metrics: str) -> str:
    """host:port, with the scheme only when it is not plain http and the path only when it is not /metrics."""
    parts = urlsplit(metrics)
    name = parts.netloc if parts.scheme == "http" else f"{parts.scheme}://{parts.netloc}"
    return name if parts.path == "/metrics" else name + parts.path


@dataclass(frozen=True)
class ClientConfig:
    """How to reach the endpoints: timeout, TLS trust and client certificate, basic auth."""

    timeout: float = 2.0
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    user: str | None = None
    password: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for https endpoints; raises EndpointError naming a file that cannot be used."""
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise EndpointError(f"--ca-file {self.ca_file}: {exc}") from exc
        if self.cert_file is not None:
            try:
                ctx.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise EndpointError(f"--cert-file {self.cert_file} / --key-file {self.key_file}: {exc}") from exc
        return ctx

    def headers(self) -> dict[str, str]:
        """Request headers: basic auth when a user is set."""
        if self.user is None:
            return {}
        token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
        return {"Authorization": f"Basic {token}"}


@dataclass
class EndpointState:
    """What the screen knows about one endpoint: its latest answer, or why there is none."""

    url: str
    name: str
    exposition: Scrape | None = None  # latest good scrape
    error: str | None = None  # why the latest scrape failed; None after a good one
    health: str | None = None  # '/healthz' answer: 'ok: …', 'unhealthy: …', or why it could not be read
    healthy: bool = False
    last_ok: float | None = None  # monotonic time of the latest good scrape
    last_attempt_done: float | None = None
    known_rows: list[Row] = field(default_factory=list)  # devices of the latest good scrape
    created: float = field(default_factory=time.monotonic)

    def waiting(self, now: float, stale_after: float) -> bool:
        """No answer yet, and not for long: the screen says 'connecting' rather than down."""
        return self.exposition is None and self.error is None and now - self.created <= stale_after

    def rows(self, now: float, stale_after: float) -> list[Row]:
        """Rows for the screen: the latest scrape, or the last known devices marked down with the reason."""
        if self.waiting(now, stale_after):
            return []
        reason = self.down_reason(now, stale_after)
        if reason is None:
            return self.exposition.rows if self.exposition is not None else []
        if self.known_rows:
            return down_rows(self.known_rows, reason)
        return down_rows([Row(RowKey(self.name, "", "", ""))], reason)

    def processes(self, now: float, stale_after: float) -> list[ProcessRow]:
        """The latest scrape's compute processes while the endpoint answers (a down one's would be stale)."""
        if self.exposition is None or self.down_reason(now, stale_after) is not None:
            return []
        return self.exposition.processes

    def down_reason(self, now: float, stale_after: float) -> str | None:
        """Why the endpoint counts as down now (failed, or silent for too long), or None."""
        if self.error is not None:
            return self.error
        if self.waiting(now, stale_after):
            return None
        last = self.last_ok if self.last_ok is not None else self.created
        if now - last > stale_after:  # a fetch hung past its timeout (a server trickling bytes)
            return f"no answer for {now - last:.0f}s"
        return None


def _get(url: str, config: ClientConfig, ctx: ssl.SSLContext | None) -> tuple[int, str]:
    """Status and body of a GET; HTTP error statuses are answers too (503 from /healthz carries the reason)."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain", **config.headers()})
    try:
        with urllib.request.urlopen(request, timeout=config.timeout, context=ctx) as response:
            return int(response.status), response.read(MAX_BODY_BYTES).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        body = exc.read(4096).decode("utf-8", "replace") if exc.fp is not None else ""
        return int(exc.code), body


def clip(text: str, limit: int = 80) -> str:
    """`text` on one line, cut after the last whole word within `limit` characters (…); a longer first word stays."""
    words = text.split()
    kept: list[str] = []
    for word in words:
        if kept and len(" ".join([*kept, word])) > limit:
            break
        kept.append(word)
    if kept and len(kept[0]) > 4 * limit:  # one endless "word" (binary garbage): even that is bounded
        return kept[0][:limit] + "…"
    return " ".join(kept) + ("…" if len(kept) < len(words) else "")


def _other_scheme(url: str, scheme: str) -> str:
    return f"{scheme}://{urlsplit(url).netloc}"


# What OpenSSL says when the peer answers a TLS handshake with plain HTTP and it reads "HTTP/1.1 400" as a record:
# WRONG_VERSION_NUMBER (OpenSSL 3.0, checked by the tests); the other two are what later versions may say instead.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"})
# X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH: the certificate is trusted, not for this name.
_NAME_MISMATCH = frozenset({62, 64})


def describe(exc: BaseException, url: str, config: ClientConfig) -> str:
    """A short reason for a failed fetch of `url`, with what to do where the cause is likely a wrong option."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    plain = urlsplit(url).scheme == "http"
    https_hint = f": if it serves HTTPS, use {_other_scheme(url, 'https')}" if plain else ""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"timed out after {config.timeout:g}s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {urlsplit(url).hostname}: {exc.strerror}"
    # http.client's RemoteDisconnected is one: what an HTTPS server does with a plain HTTP request is hang up.
    if isinstance(exc, ConnectionResetError):
        return "the connection was closed without an HTTP answer" + https_hint
    if isinstance(exc, HTTPException):  # e.g. BadStatusLine from a peer that does not speak HTTP
        line = str(exc).strip()
        if line[:1] in ("\x15", "\x16"):  # a TLS record (alert, handshake) where a status line should be
            return "answered in TLS, not plain HTTP" + https_hint
        return f"not an HTTP answer ({type(exc).__name__}: {clip(line, 40)!r})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in _NAME_MISMATCH:
            return f"TLS: {exc.verify_message}"
        trust = f"--ca-file {config.ca_file} did not sign it" if config.ca_file else "pass its CA with --ca-file"
        return f"TLS: certificate not trusted ({exc.verify_message}): {trust}"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if reason in _NOT_TLS:
            return f"TLS: {reason}: if it serves plain HTTP, use {_other_scheme(url, 'http')}"
        return f"TLS: {reason}"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return clip(str(text))


def status_error(status: int, body: str, config: ClientConfig) -> str:
    """'HTTP 401: unauthorized (…)': the status, its phrase where the body says nothing, the body cut at a word."""
    text = clip(body)
    if not text:
        with contextlib.suppress(ValueError):
            text = HTTPStatus(status).phrase
    reason = f"HTTP {status}: {text}" if text else f"HTTP {status}"
    if status == HTTPStatus.UNAUTHORIZED:
        reason += " (check --user and the password)" if config.user else " (it needs --user and --password-file)"
    return reason


def scrape(state: EndpointState, config: ClientConfig, ctx: ssl.SSLContext | None) -> None:
    """Fetch /metrics and /healthz of one endpoint once and record the outcome in `state`."""
    try:
        status, body = _get(state.url, config, ctx)
        if status != 200:
            raise ScrapeError(status_error(status, body, config))
        exposition = parse_exposition(body, state.name)
    except (OSError, HTTPException, ValueError) as exc:  # HTTPException: not HTTP at all (BadStatusLine)
        # A ScrapeError's text is already a reason (an HTTP status, a parse error); the limit only bounds the latter.
        state.error = clip(str(exc), 160) if isinstance(exc, ScrapeError) else describe(exc, state.url, config)
        state.health = None
        state.healthy = False
        state.last_attempt_done = time.monotonic()
        return
    try:
        hstatus, hbody = _get(healthz_url(state.url), config, ctx)
        state.health = hbody.strip() or f"HTTP {hstatus}"
        state.healthy = hstatus == 200
    except (OSError, HTTPException, ValueError) as exc:
        state.health, state.healthy = f"/healthz: {describe(exc, state.url, config)}", False
    recent_step_times(exposition, state.exposition)
    state.exposition, state.error = exposition, None
    state.known_rows = exposition.rows
    state.last_ok = state.last_attempt_done = time.monotonic()


class Poller:
    """One daemon thread per endpoint scraping every `interval`; the screen reads the states, never waits on them."""

    def __init__(self, urls: list[str], config: ClientConfig, interval: float) -> None:
        self.states = [EndpointState(url, display_name(url)) for url in urls]
        self._config = config
        self._interval = interval
        needs_tls = any(url.startswith("https:") for url in urls)
        self._ctx = config.ssl_context() if needs_tls else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.on_change: Callable[[], None] = lambda: None  # called on a scraping thread after each scrape

    @property
    def config(self) -> ClientConfig:
        """How the endpoints are reached (the `t` key's trace goes the same way)."""
        return self._config

    def scrape_all_once(self) -> None:
        """Scrape every endpoint once, concurrently, waiting at most the timeout (plus a little) for each."""
        threads = [threading.Thread(target=self._once, args=(s,), daemon=True) for s in self.states]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self._config.timeout * 2 + 1.0  # /metrics and /healthz each get the timeout
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.0))
        with self._lock:
            for state, t in zip(self.states, threads, strict=True):
                if t.is_alive():
                    state.error = "timed out"

    def _once(self, state: EndpointState) -> None:
        fresh = EndpointState(state.url, state.name, known_rows=state.known_rows)
        scrape(fresh, self._config, self._ctx)
        with self._lock:  # swap the outcome in whole, so the screen never sees half a scrape
            state.error, state.health, state.healthy = fresh.error, fresh.health, fresh.healthy
            state.last_attempt_done = fresh.last_attempt_done
            if fresh.error is None:
                state.exposition, state.known_rows, state.last_ok = fresh.exposition, fresh.known_rows, fresh.last_ok
        self.on_change()

    def start(self) -> None:
        """Start one scraping thread per endpoint."""
        for state in self.states:
            t = threading.Thread(target=self._loop, args=(state,), name=f"top-{state.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _loop(self, state: EndpointState) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self._once(state)
            self._stop.wait(max(self._interval - (time.monotonic() - started), 0.0))

    def stop(self) -> None:
        """Ask the threads to stop (they are daemon threads: one hung in a fetch does not hold up exit)."""
        self._stop.set()

    def snapshot(self) -> list[EndpointState]:
        """Copies of the endpoint states, consistent with each other's scrapes."""
        with self._lock:
            return [replace(s, known_rows=list(s.known_rows)) for s in self.states]
