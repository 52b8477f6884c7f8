"""`--web.config.file`: TLS, mTLS, basic auth and response headers in the exporter-toolkit format.

The format is Prometheus exporter-toolkit's (docs/web-configuration.md there), which node_exporter and
dcgm-exporter users already have. Parsing is strict: an unknown key, an unknown TLS version, a client CA without a
client-auth policy or a hash that is not bcrypt is rejected with a message naming the key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Python's ssl module verifies any certificate it asks for, so the toolkit's two "accept an unverified client
# certificate" policies (RequestClientCert, RequireAnyClientCert) cannot be offered honestly.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# Headers jaxmon sets itself; a web config may not override them.
RESERVED_HEADERS = {"content-type", "content-length", "content-encoding", "transfer-encoding", "connection",
                    "www-authenticate", "vary", "date", "server", "allow"}  # fmt: skip


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TLSServerConfig(_Strict):
    """`tls_server_config`."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    @field_validator("client_auth_type")
    @classmethod
    def _auth(cls, value: str) -> str:
        if value in UNSUPPORTED_CLIENT_AUTH:
            raise ValueError(f"{value} is not supported (Python verifies every client certificate it requests)")
        if value not in CLIENT_AUTH:
            raise ValueError(f"unknown client_auth_type {value!r}; use one of {', '.join(CLIENT_AUTH)}")
        return value

    @field_validator("min_version", "max_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in TLS_VERSIONS:
            raise ValueError(f"unknown TLS version {value!r}; use one of {', '.join(TLS_VERSIONS)}")
        return value

    @model_validator(mode="after")
    def _policy(self) -> TLSServerConfig:
        verifying = self.client_auth_type != "NoClientCert"
        if self.client_ca_file is not None and not verifying:
            raise ValueError(
                "client_ca_file is set but client_auth_type is NoClientCert; set client_auth_type to "
                "RequireAndVerifyClientCert or VerifyClientCertIfGiven"
            )
        if verifying and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self


class HTTPServerConfig(_Strict):
    """`http_server_config`."""

    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, content in value.items():
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by jaxmon and cannot be configured")
            if not name or any(c in name for c in " :\r\n\t") or any(c in content for c in "\r\n"):
                raise ValueError(f"header {name!r} is not a valid header name/value")
        return value


class WebConfigFile(_Strict):
    """The whole file."""

    tls_server_config: TLSServerConfig | None = None
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt(cls, value: dict[str, str]) -> dict[str, str]:
        for user, hashed in value.items():
            if ":" in user or not user:
                raise ValueError(f"user name {user!r} is empty or contains ':'")
            if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
                raise ValueError(f"password of user {user!r} is not a bcrypt hash")
            try:
                bcrypt.checkpw(b"", hashed.encode())
            except ValueError as exc:
                raise ValueError(f"password of user {user!r} is not a valid bcrypt hash: {exc}") from exc
        return value


@dataclass
class WebConfig:
    """A loaded web config: the parsed file, and the files it depends on (for reloads)."""

    source: Path | None
    spec: WebConfigFile = field(default_factory=WebConfigFile)

    @property
    def tls(self) -> TLSServerConfig | None:
        """The TLS part, if any."""
        return self.spec.tls_server_config

    def watched_files(self) -> list[Path]:
        """The config file and every file it names."""
        files = [self.source] if self.source else []
        if self.tls is not None:
            files += [self.tls.cert_file, self.tls.key_file]
            if self.tls.client_ca_file is not None:
                files.append(self.tls.client_ca_file)
        return files


def _where(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "file"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def load_web_config(path: Path | None) -> WebConfig:
    """Parse and validate the file (None: plain HTTP, no auth); TLS files are checked by loading them."""
    if path is None:
        return WebConfig(source=None)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WebConfigError(f"web config {path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise WebConfigError(f"web config {path}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise WebConfigError(f"web config {path}: must be a mapping, not {type(raw).__name__}")
    base = path.parent
    tls_raw = raw.get("tls_server_config")
    if isinstance(tls_raw, dict):
        # Relative paths are relative to the config file, as in exporter-toolkit.
        for key in ("cert_file", "key_file", "client_ca_file"):
            if isinstance(tls_raw.get(key), str) and not os.path.isabs(tls_raw[key]):
                tls_raw[key] = str(base / tls_raw[key])
    try:
        spec = WebConfigFile.model_validate(raw)
    except ValidationError as exc:
        raise WebConfigError(f"web config {path}: {_where(exc)}") from exc
    config = WebConfig(source=path, spec=spec)
    if config.tls is not None:
        try:
            build_ssl_context(config.tls)  # fail now, naming the file, rather than at the first handshake
        except WebConfigError as exc:
            raise WebConfigError(f"web config {path}: {exc}") from exc
    return config


def build_ssl_context(tls: TLSServerConfig, context: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """A server context for `tls`, or `context` updated in place (new handshakes use the new settings)."""
    ctx = context or ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(certfile=str(tls.cert_file), keyfile=str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(
            f"tls_server_config.cert_file/key_file: cannot load {tls.cert_file} / {tls.key_file}: {exc}"
        ) from exc
    if tls.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=str(tls.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_server_config.client_ca_file: cannot load {tls.client_ca_file}: {exc}") from exc
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    ctx.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


# A real bcrypt hash (of a random password) to check unknown users against, so that an unknown user costs the
# same time as a wrong password.
_DUMMY_HASH = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=10))


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes; caches recent successes like exporter-toolkit."""

    def __init__(self, users: dict[str, str], cache_size: int = 256) -> None:
        self._users = {u: h.encode() for u, h in users.items()}
        # Unknown users are checked against a hash of the same cost as the configured ones.
        cost = int(next(iter(self._users.values()))[4:6]) if self._users else 10
        self._dummy = _DUMMY_HASH if cost == 10 else bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=cost))
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
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else self._dummy) and hashed is not None
        if ok:
            with self._lock:
                self._cache[key] = True
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return ok
