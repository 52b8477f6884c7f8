"""Who may ask and how often: basic auth against bcrypt hashes, and the web config's rate limit."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from jaxmon.web.webconfig import RateLimit

T = TypeVar("T")

_BCRYPT_ALPHABET = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# What an unknown user is checked against: a fixed, moderate cost, as exporter-toolkit's decoy hash (cost 10,
# web/handler.go). The highest configured cost instead (cost 18 in the toolkit's own users file: 12.6 s a
# check here) let every unauthenticated peer buy seconds of CPU per request.
DECOY_COST = 10


def decoy_hash(cost: int = DECOY_COST) -> bytes:
    """A well-formed bcrypt hash of the given cost that matches no password, made without hashing anything.

    Checking a password against it costs what checking against a real hash of that cost does (bcrypt.checkpw
    hashes with the salt and cost, then compares).
    """
    import bcrypt  # only where basic auth is configured (a daemon without users never loads it)

    return bcrypt.gensalt(rounds=cost) + bytes(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31))


class CheckQueue:
    """bcrypt checks off the event loop, on one thread of their own, with at most `limit` waiting or running.

    One thread: bcrypt releases the GIL and takes a whole core while it hashes, so the event loop keeps the other
    core whatever peers send; past `limit`, a check is refused at once rather than queued for minutes.
    """

    def __init__(self, limit: int = 8) -> None:
        self.limit = limit
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxmon-bcrypt")
        self._waiting = 0

    async def run(self, fn: Callable[..., T], *args: object) -> T | None:
        """`fn(*args)` on the bcrypt thread; None when `limit` checks are already waiting (call on the loop)."""
        if self._waiting >= self.limit:
            return None
        self._waiting += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._waiting -= 1

    def close(self) -> None:
        """Stop the thread once its current check ends; waiting checks are dropped."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes; caches recent successes like exporter-toolkit, so a
    scraper with a costly hash pays once and is then answered without bcrypt."""

    def __init__(self, users: dict[str, str], cache_size: int = 256) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        self._key = os.urandom(32)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @functools.cached_property
    def decoy(self) -> bytes:
        """What an unknown user's password is checked against, made at the first check (or look)."""
        return decoy_hash()

    @property
    def enabled(self) -> bool:
        """True when the config lists users."""
        return bool(self._users)

    def _key_of(self, user: str, password: str) -> bytes:
        hashed = self._users.get(user, b"")
        return hmac.new(self._key, f"{user}\0{password}".encode() + b"\0" + hashed, hashlib.sha256).digest()

    def cached(self, user: str, password: str) -> bool:
        """True when this pair passed a check recently (a keyed hash: microseconds, fine on the event loop)."""
        key = self._key_of(user, password)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return True
        return False

    def check(self, user: str, password: str) -> bool:
        """Whether the pair is valid; slow (bcrypt) on a cache miss: run it on a CheckQueue."""
        if self.cached(user, password):
            return True
        import bcrypt

        hashed = self._users.get(user)
        key = self._key_of(user, password)
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else self.decoy) and hashed is not None
        if ok:
            with self._lock:
                self._cache[key] = True
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return ok


class RateLimiter:
    """golang.org/x/time/rate's Limiter.Allow: a bucket of `burst` tokens, one more every `interval` seconds.

    The bucket starts full; a burst of 0 allows nothing, as there.
    """

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._tokens = float(limit.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        """Take a token if there is one."""
        with self._lock:
            now = self._clock()
            elapsed = max(now - self._last, 0.0)
            self._last = now
            self._tokens = min(float(self.limit.burst), self._tokens + elapsed / self.limit.interval)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False
