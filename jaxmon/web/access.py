"""Who may ask and how often: basic auth against bcrypt hashes, and the web config's rate limit."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import bcrypt

from jaxmon.web.webconfig import RateLimit, bcrypt_cost

_BCRYPT_ALPHABET = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def decoy_hash(cost: int) -> bytes:
    """A well-formed bcrypt hash of the given cost that matches no password, made without hashing anything.

    Checking a password against it costs what checking against a real hash of that cost does (bcrypt.checkpw
    hashes with the salt and cost, then compares), so unknown users take as long as known ones. exporter-toolkit
    hashes a decoy password instead (web/handler.go decoyHashes), which at cost 18 takes ~30 s on first use.
    """
    return bcrypt.gensalt(rounds=cost) + bytes(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31))


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes; caches recent successes like exporter-toolkit."""

    def __init__(self, users: dict[str, str], cache_size: int = 256) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        # The highest cost in use, as the toolkit's maxBcryptCost: an unknown user is never answered faster
        # than a configured one.
        self.decoy = decoy_hash(max((bcrypt_cost(h) for h in users.values()), default=10))
        self._key = os.urandom(32)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """True when the config lists users."""
        return bool(self._users)

    def check(self, user: str, password: str) -> bool:
        """Whether the pair is valid; slow (bcrypt) on a cache miss: call it off the event loop."""
        hashed = self._users.get(user)
        key = hmac.new(self._key, f"{user}\0{password}".encode() + b"\0" + (hashed or b""), hashlib.sha256).digest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return True
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
