"""The live web config: re-read when a file it names changes or on SIGHUP, never loosened without a restart."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import structlog

from jaxmon.web.access import BasicAuth, RateLimiter
from jaxmon.web.config_error import WebConfigError
from jaxmon.web.tls import LiveContext, ServerContext, build_context, live_context
from jaxmon.web.webconfig import WebConfig, load_web_config

log = structlog.get_logger("jaxmon.web.reload")


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
