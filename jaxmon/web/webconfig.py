"""`--web.config.file`: TLS, mTLS, basic auth, headers and a rate limit in the exporter-toolkit format.

The format is Prometheus exporter-toolkit's (docs/web-configuration.md there), which node_exporter and
dcgm-exporter users already have; the checks and their order follow its web/tls_config.go and web/handler.go, so a
file either tool accepts, the other accepts too, except where docs/security.md says why not. Parsing is strict: an
unknown key is rejected, and every error names the file and the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jaxmon.web.config_error import WebConfigError
from jaxmon.web.tls import TLSSettings, build_context

TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")
# exporter-toolkit's curve names (tls_config.go `curves`) and the OpenSSL names Python's ssl takes for them.
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# Go's tls.CipherSuites(): the names exporter-toolkit accepts in cipher_suites (anything else: "unknown cipher").
GO_CIPHER_SUITES = frozenset(
    {
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS_RSA_WITH_AES_128_CBC_SHA",
        "TLS_RSA_WITH_AES_256_CBC_SHA",
        "TLS_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_RSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
        "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
        "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
        "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    }
)
VERIFYING_CLIENT_AUTH = ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
# Python's ssl verifies every client certificate it asks for (there is no hook to accept an unverified one), so
# the toolkit's two "ask but do not verify" policies cannot be offered honestly. RequireClientCert is the
# toolkit's old name for RequireAnyClientCert.
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# The only response headers the toolkit lets a config set, with the values it allows (None: any value);
# web/handler.go `extraHTTPHeaders`. Names are matched exactly, as there.
EXTRA_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
# What golang.org/x/crypto/bcrypt.Cost reads: "$2" + optional minor + "$" + two-digit cost + "$" + 53 chars.
_BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
_GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TLSSection(_Strict):
    """`tls_server_config` as written (validated by `check_tls`)."""

    cert_file: str = ""
    key_file: str = ""
    cert: str = ""
    key: str = ""
    client_ca_file: str = ""
    client_ca: str = ""
    client_auth_type: str = ""
    cipher_suites: list[str] | None = None
    curve_preferences: list[str] = Field(default_factory=list)
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True
    client_allowed_sans: list[str] | None = None

    def enabled(self) -> bool:
        """Whether the section turns TLS on (the toolkit's TLSConfig.IsEnabled: any cert, key, CA or policy)."""
        return any((self.cert_file, self.key_file, self.cert, self.key, self.client_ca_file, self.client_ca,
                    self.client_auth_type))  # fmt: skip


class HTTPSection(_Strict):
    """`http_server_config`."""

    http2: bool = True
    headers: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class RateLimitSection(_Strict):
    """`rate_limit`: `burst` requests at once, then one per `interval` (golang.org/x/time/rate)."""

    interval: str | int | float = 0
    burst: int = 0


class WebConfigFile(_Strict):
    """The whole file."""

    tls_server_config: TLSSection = Field(default_factory=TLSSection)
    http_server_config: HTTPSection = Field(default_factory=HTTPSection)
    rate_limit: RateLimitSection = Field(default_factory=RateLimitSection)
    basic_auth_users: dict[str, str] | None = None


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: `burst` tokens, refilled one per `interval` seconds."""

    interval: float
    burst: int


@dataclass
class WebConfig:
    """A loaded web config: TLS (None: plain HTTP), users, headers, rate limit, and notes to log."""

    source: Path | None
    tls: TLSSettings | None = None
    users: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None
    # Things the file asks for that jaxmon applies only in part (logged at every load).
    notes: list[str] = field(default_factory=list)

    def watched_files(self) -> list[Path]:
        """The config file and every file it names."""
        return ([self.source] if self.source else []) + (self.tls.files() if self.tls else [])


def parse_go_duration(value: str | int | float, key: str) -> float:
    """Seconds in a Go duration ("1s", "1m30s", "500ms"); a bare 0 is zero. Bare numbers are refused."""
    if isinstance(value, bool):
        raise WebConfigError(f"{key}: {value!r} is not a duration; write one like 1s or 500ms")
    if isinstance(value, int | float):
        if value == 0:
            return 0.0
        # Go's YAML would read a bare number as nanoseconds; nobody means that, so ask for a unit.
        raise WebConfigError(f"{key}: {value!r} has no unit; write a duration like 1s or 500ms")
    text = value.strip()
    if text in ("0", ""):
        return 0.0
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    pos, total = 0, 0.0
    while pos < len(body):
        m = _GO_DURATION.match(body, pos)
        if m is None:
            raise WebConfigError(f"{key}: {value!r} is not a duration; write one like 1s, 1m30s or 500ms")
        total += float(m.group(1)) * _GO_DURATION_UNITS[m.group(2)]
        pos = m.end()
    if not body:
        raise WebConfigError(f"{key}: {value!r} is not a duration; write one like 1s, 1m30s or 500ms")
    return sign * total


def bcrypt_cost(hashed: str) -> int:
    """The cost of a bcrypt hash, read without hashing (as the toolkit's bcrypt.Cost); ValueError if not bcrypt."""
    m = _BCRYPT.fullmatch(hashed)
    if m is None:
        raise ValueError("is not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)")
    cost = int(m.group(1))
    if not 4 <= cost <= 31:
        raise ValueError(f"has bcrypt cost {cost}, outside 4..31")
    return cost


def _header_value(value: str | int | float | bool | None) -> str:
    # Go's YAML turns a scalar into the string it was written as; `X-XSS-Protection: 1` is common.
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def check_headers(headers: dict[str, str | int | float | bool | None]) -> dict[str, str]:
    """The toolkit's validateHeaderConfig: five names, and the values it enumerates."""
    out: dict[str, str] = {}
    for name, raw in headers.items():
        value = _header_value(raw)
        if name not in EXTRA_HEADERS:
            near = [h for h in EXTRA_HEADERS if h.lower() == name.lower()]
            hint = f" (did you mean {near[0]!r}?)" if near else f"; allowed: {', '.join(EXTRA_HEADERS)}"
            raise WebConfigError(f"http_server_config.headers: HTTP header {name!r} can not be configured{hint}")
        allowed = EXTRA_HEADERS[name]
        if allowed is not None and value not in allowed:
            raise WebConfigError(
                f"http_server_config.headers: invalid value for {name}: expected one of "
                f"{', '.join(repr(a) for a in allowed)}, got {value!r}"
            )
        if any(c in value for c in "\r\n\0"):
            raise WebConfigError(f"http_server_config.headers: value of {name} contains a line break or NUL")
        out[name] = value
    return out


def check_users(users: dict[str, str] | None) -> dict[str, str]:
    """Every hash must be bcrypt with a readable cost; nothing is hashed at load (a cost-18 hash takes ~30 s)."""
    for user, hashed in (users or {}).items():
        if not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: user name {user!r} is empty or contains ':'")
        try:
            bcrypt_cost(hashed)
        except ValueError as exc:
            raise WebConfigError(f"basic_auth_users: password of user {user!r} {exc}") from exc
    return dict(users or {})


def _path(value: str, base: Path) -> Path | None:
    if not value:
        return None
    # Relative paths are relative to the config file, as in exporter-toolkit (config_util.JoinDir).
    return Path(value) if os.path.isabs(value) else base / value


def check_tls(t: TLSSection, base: Path) -> tuple[TLSSettings | None, list[str]]:
    """The toolkit's ConfigToTLSConfig checks, in its order; None when the section does not turn TLS on."""
    for key, version in (("min_version", t.min_version), ("max_version", t.max_version)):
        if version not in TLS_VERSIONS:
            raise WebConfigError(
                f"tls_server_config.{key}: unknown TLS version {version!r}; use one of {', '.join(TLS_VERSIONS)}"
            )
    for name in t.curve_preferences:
        if name not in CURVES:
            raise WebConfigError(
                f"tls_server_config.curve_preferences: unknown curve {name!r}; use {', '.join(CURVES)}"
            )
    if t.cipher_suites:
        unknown = [c for c in t.cipher_suites if c not in GO_CIPHER_SUITES]
        if unknown:
            raise WebConfigError(f"tls_server_config.cipher_suites: unknown cipher {unknown[0]!r}")
        raise WebConfigError(
            "tls_server_config.cipher_suites is not supported: jaxmon uses Python's default TLS 1.2 suites "
            "(forward-secret only, no SHA-1), and Python cannot choose TLS 1.3 suites; remove the key"
        )
    if not t.enabled():
        return None, []
    if not t.cert_file and not t.cert:
        raise WebConfigError("tls_server_config: missing one of cert or cert_file")
    if not t.key_file and not t.key:
        raise WebConfigError("tls_server_config: missing one of key or key_file")
    for key, value in (("cert_file", t.cert_file), ("key_file", t.key_file), ("client_ca_file", t.client_ca_file)):
        # Files are read before the policy is checked, as in the toolkit (so a missing file is named first).
        file = _path(value, base)
        if file is not None and not os.access(file, os.R_OK):
            why = "no such file" if not file.exists() else "permission denied"
            raise WebConfigError(f"tls_server_config: failed to read {key} ({file}): {why}")
    auth = t.client_auth_type or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth} is not supported: it accepts client certificates "
            "nobody verified, and Python's ssl verifies every certificate it asks for; use RequireAndVerifyClientCert"
        )
    if auth != "NoClientCert" and auth not in VERIFYING_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: invalid ClientAuth {auth!r}; use one of NoClientCert, "
            f"{', '.join(VERIFYING_CLIENT_AUTH)}"
        )
    if (t.client_ca_file or t.client_ca) and auth == "NoClientCert":
        raise WebConfigError(
            "tls_server_config: client CA's have been configured without a Client Auth Policy: client_ca_file is "
            "set but client_auth_type is NoClientCert; set it to RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        )
    if t.client_allowed_sans is not None and auth != "RequireAndVerifyClientCert":
        raise WebConfigError(
            "tls_server_config.client_allowed_sans requires client_auth_type RequireAndVerifyClientCert"
        )
    if TLS_VERSIONS.index(t.min_version) > TLS_VERSIONS.index(t.max_version):
        raise WebConfigError(f"tls_server_config: min_version {t.min_version} is above max_version {t.max_version}")
    notes = []
    curve = CURVES[t.curve_preferences[0]] if t.curve_preferences else None
    if len(t.curve_preferences) > 1:
        # CPython's SSLContext.set_ecdh_curve takes one curve (SSL_CTX_set1_groups with a list of one).
        notes.append(
            f"tls_server_config.curve_preferences: Python's ssl can offer one curve only; offering "
            f"{t.curve_preferences[0]}, not {', '.join(t.curve_preferences[1:])}"
        )
    settings = TLSSettings(
        cert_file=_path(t.cert_file, base),
        key_file=_path(t.key_file, base),
        cert_pem=t.cert,
        key_pem=t.key,
        client_ca_file=_path(t.client_ca_file, base),
        client_ca_pem=t.client_ca,
        client_auth=auth,
        min_version=t.min_version,
        max_version=t.max_version,
        curve=curve,
        prefer_server_ciphers=t.prefer_server_cipher_suites,
        allowed_sans=frozenset(t.client_allowed_sans) if t.client_allowed_sans is not None else None,
    )
    return settings, notes


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
    """Parse and check the file (None: plain HTTP, no auth); certificates, keys and CAs are loaded to check them."""
    if path is None:
        return WebConfig(source=None)
    import yaml  # only with a web config file (see jaxmon.settings.load)

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WebConfigError(f"web config {path}: cannot read: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"web config {path}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise WebConfigError(f"web config {path}: must be a mapping, not {type(raw).__name__}")
    for key in ("tls_server_config", "http_server_config", "rate_limit"):
        if key in raw and raw[key] is None:
            del raw[key]  # an empty section, as in the toolkit
    try:
        spec = WebConfigFile.model_validate(raw)
        tls, notes = check_tls(spec.tls_server_config, path.parent)
        config = WebConfig(
            source=path,
            tls=tls,
            users=check_users(spec.basic_auth_users),
            headers=check_headers(spec.http_server_config.headers),
            notes=notes,
        )
        interval = parse_go_duration(spec.rate_limit.interval, "rate_limit.interval")
        if interval < 0 or spec.rate_limit.burst < 0:
            raise WebConfigError("rate_limit: interval and burst must not be negative")
        if interval > 0:
            config.rate_limit = RateLimit(interval=interval, burst=spec.rate_limit.burst)
        if tls is not None:
            build_context(tls)  # fail now, naming the file, rather than at the first handshake
    except ValidationError as exc:
        raise WebConfigError(f"web config {path}: {_where(exc)}") from exc
    except WebConfigError as exc:
        raise WebConfigError(f"web config {path}: {exc}") from exc
    return config
