"""The web config file: a table of good and bad files with the expected error for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from jaxmon.web.access import DECOY_COST, BasicAuth, RateLimiter, decoy_hash
from jaxmon.web.config_error import WebConfigError
from jaxmon.web.webconfig import RateLimit, load_web_config, parse_go_duration
from tests.helpers import FIXTURES
from tests.tls_helpers import Certs, bcrypt_hash, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


def _tls(certs: Certs, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key), **extra}


def _encrypted_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    return pem.decode()


def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


GOOD: list[tuple[str, Any]] = [
    ("empty file: plain HTTP", ""),
    ("TLS only", lambda c: {"tls_server_config": _tls(c)}),
    ("TLS 1.3 only", lambda c: {"tls_server_config": _tls(c, min_version="TLS13", max_version="TLS13")}),
    (
        "mTLS required",
        lambda c: {
            "tls_server_config": _tls(c, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(c.client_ca))
        },
    ),
    (
        "mTLS optional",
        lambda c: {
            "tls_server_config": _tls(c, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(c.client_ca))
        },
    ),
    ("basic auth", lambda c: {"basic_auth_users": {"prom": bcrypt_hash("secret")}}),
    ("headers", lambda c: {"http_server_config": {"headers": {"X-Frame-Options": "deny"}}}),
    ("a numeric header value", lambda c: {"http_server_config": {"headers": {"X-XSS-Protection": 1}}}),
    ("http2 (served as HTTP/1.1)", lambda c: {"http_server_config": {"http2": False}}),
    (
        "a verifying policy without client_ca_file (system roots)",
        lambda c: {"tls_server_config": _tls(c, client_auth_type="RequireAndVerifyClientCert")},
    ),
    (
        "inline cert and key",
        lambda c: {"tls_server_config": {"cert": c.server_cert.read_text(), "key": c.server_key.read_text()}},
    ),
    (
        "client_allowed_sans",
        lambda c: {
            "tls_server_config": _tls(
                c,
                client_auth_type="RequireAndVerifyClientCert",
                client_ca_file=str(c.client_ca),
                client_allowed_sans=["scraper.example"],
            )
        },
    ),
    ("one curve", lambda c: {"tls_server_config": _tls(c, curve_preferences=["X25519"])}),
    ("rate limit", lambda c: {"rate_limit": {"interval": "1m30s", "burst": 5}}),
    ("TLS versions without a certificate: plain HTTP", lambda c: {"tls_server_config": {"min_version": "TLS13"}}),
]

BAD: list[tuple[str, Any, str]] = [
    ("unknown top-level key", lambda c: {"tls_config": {}}, "tls_config: unknown key"),
    (
        "unknown TLS key",
        lambda c: {"tls_server_config": _tls(c, cipher_suite=["x"])},
        "tls_server_config.cipher_suite: unknown key",
    ),
    (
        "unknown TLS version",
        lambda c: {"tls_server_config": _tls(c, min_version="TLS14")},
        "tls_server_config.min_version: unknown TLS version 'TLS14'",
    ),
    (
        "min above max",
        lambda c: {"tls_server_config": _tls(c, min_version="TLS13", max_version="TLS12")},
        "min_version TLS13 is above max_version TLS12",
    ),
    (
        "client CA without policy",
        lambda c: {"tls_server_config": _tls(c, client_ca_file=str(c.client_ca))},
        "client_ca_file is set but client_auth_type is NoClientCert",
    ),
    (
        "unknown client auth type",
        lambda c: {"tls_server_config": _tls(c, client_auth_type="Sometimes")},
        "tls_server_config.client_auth_type: invalid ClientAuth 'Sometimes'",
    ),
    (
        "unverified client certs",
        lambda c: {
            "tls_server_config": _tls(c, client_auth_type="RequireAnyClientCert", client_ca_file=str(c.client_ca))
        },
        "RequireAnyClientCert is not supported",
    ),
    (
        "missing key file",
        lambda c: {"tls_server_config": {"cert_file": str(c.server_cert)}},
        "tls_server_config: missing one of key or key_file",
    ),
    (
        "certificate that does not exist",
        lambda c: {"tls_server_config": _tls(c, cert_file="/nonexistent.pem")},
        "failed to read cert_file (/nonexistent.pem): no such file",
    ),
    (
        "bad bcrypt hash",
        lambda c: {"basic_auth_users": {"prom": "plaintext"}},
        "basic_auth_users: password of user 'prom' is not a bcrypt hash",
    ),
    (
        "md5 crypt instead of bcrypt",
        lambda c: {"basic_auth_users": {"prom": "$1$abc$" + "x" * 53}},
        "is not a bcrypt hash",
    ),
    (
        "reserved header",
        lambda c: {"http_server_config": {"headers": {"Content-Type": "text/html"}}},
        "HTTP header 'Content-Type' can not be configured",
    ),
    (
        "a header outside the toolkit's five",
        lambda c: {"http_server_config": {"headers": {"X-Custom": "1"}}},
        "HTTP header 'X-Custom' can not be configured; allowed: Strict-Transport-Security",
    ),
    (
        "a header name in the wrong case",
        lambda c: {"http_server_config": {"headers": {"x-frame-options": "deny"}}},
        "did you mean 'X-Frame-Options'?",
    ),
    (
        "a header value the toolkit does not allow",
        lambda c: {"http_server_config": {"headers": {"X-Frame-Options": "foo"}}},
        "invalid value for X-Frame-Options: expected one of 'deny', 'sameorigin', got 'foo'",
    ),
    (
        "unknown http_server_config key",
        lambda c: {"http_server_config": {"compression": True}},
        "http_server_config.compression: unknown key",
    ),
    (
        "client_allowed_sans without required client certificates",
        lambda c: {
            "tls_server_config": _tls(
                c,
                client_auth_type="VerifyClientCertIfGiven",
                client_ca_file=str(c.client_ca),
                client_allowed_sans=["x"],
            )
        },
        "client_allowed_sans requires client_auth_type RequireAndVerifyClientCert",
    ),
    (
        "cipher_suites",
        lambda c: {"tls_server_config": _tls(c, cipher_suites=["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"])},
        "tls_server_config.cipher_suites is not supported",
    ),
    (
        "a rate limit interval without a unit",
        lambda c: {"rate_limit": {"interval": 5, "burst": 1}},
        "rate_limit.interval: 5 has no unit",
    ),
    ("a bcrypt cost above 31", lambda c: {"basic_auth_users": {"prom": "$2b$32$" + "a" * 53}}, "outside 4..31"),
    (
        "an encrypted private key",
        lambda c: {"tls_server_config": {"cert_file": str(c.server_cert), "key": _encrypted_key()}},
        "the private key is encrypted",
    ),
    ("not a mapping", "- a\n- b\n", "must be a mapping"),
    ("not YAML", "tls_server_config: [unclosed", "not valid YAML"),
]


@pytest.mark.parametrize(("name", "doc"), GOOD, ids=[g[0] for g in GOOD])
def test_good_web_configs_load(name: str, doc: Any, certs: Certs, tmp_path: Path) -> None:
    path = _write(tmp_path, doc(certs) if callable(doc) else doc)
    config = load_web_config(path)
    assert config.source == path


@pytest.mark.parametrize(("name", "doc", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_web_configs_are_rejected_naming_the_key(
    name: str, doc: Any, message: str, certs: Certs, tmp_path: Path
) -> None:
    path = _write(tmp_path, doc(certs) if callable(doc) else doc)
    with pytest.raises(WebConfigError) as err:
        load_web_config(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_relative_certificate_paths_are_relative_to_the_config_file(certs: Certs) -> None:
    path = certs.server_cert.parent / "web.yml"
    path.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": certs.server_cert.name, "key_file": certs.server_key.name}})
    )
    config = load_web_config(path)
    assert config.tls is not None and config.tls.cert_file == certs.server_cert


def test_an_unknown_user_is_checked_against_a_decoy_of_a_fixed_moderate_cost() -> None:
    """As exporter-toolkit's decoy (cost 10): never the highest configured cost, which an unauthenticated peer
    could make the exporter pay for every request (cost 18: 12.6 s a check here)."""
    auth = BasicAuth({"low": bcrypt_hash("a", rounds=4), "high": bcrypt_hash("b", rounds=6)})
    assert auth.decoy[:7] == b"$2b$10$" and DECOY_COST == 10
    assert auth.check("nobody", "b") is False
    assert auth.check("high", "wrong") is False
    assert auth.cached("high", "b") is False
    assert auth.check("high", "b") is True
    assert auth.cached("high", "b") is True  # a success is remembered: the next request needs no bcrypt
    assert auth.check("high", "b") is True
    assert auth.check("low", "b") is False
    assert auth.cached("nobody", "b") is False and auth.cached("high", "wrong") is False


def test_a_decoy_hash_is_well_formed_and_matches_no_password() -> None:
    decoy = decoy_hash(4)
    assert len(decoy) == 60 and decoy.startswith(b"$2b$04$")
    assert not bcrypt.checkpw(b"", decoy)
    assert not bcrypt.checkpw(b"password", decoy)


def test_users_load_without_hashing_even_at_cost_31() -> None:
    # A cost-31 bcrypt check takes days: loading must only read the cost, as the toolkit does; the decoy stays 10.
    auth = BasicAuth({"slow": "$2y$31$" + "a" * 53})
    assert auth.decoy[:7] == b"$2b$10$"


def test_the_toolkit_users_file_loads_at_once(tmp_path: Path) -> None:
    # bob's hash has cost 18 (~13 s per check here); loading reads the cost only.
    config = load_web_config(FIXTURES / "etk" / "web_config_users_noTLS.good.yml")
    assert sorted(config.users) == ["alice", "bob", "carol", "dave"]
    assert BasicAuth(config.users).decoy[:7] == b"$2b$10$"


def test_the_rate_limiter_is_a_token_bucket_that_starts_full() -> None:
    now = [100.0]
    limiter = RateLimiter(RateLimit(interval=10.0, burst=2), clock=lambda: now[0])
    assert [limiter.allow() for _ in range(3)] == [True, True, False]
    now[0] += 5.0  # half a token
    assert limiter.allow() is False
    now[0] += 5.0  # the other half: one token
    assert [limiter.allow(), limiter.allow()] == [True, False]
    now[0] += 1000.0  # refills up to the burst, no further
    assert [limiter.allow() for _ in range(3)] == [True, True, False]


def test_a_burst_of_zero_allows_nothing() -> None:
    now = [0.0]
    limiter = RateLimiter(RateLimit(interval=1.0, burst=0), clock=lambda: now[0])
    now[0] += 3600
    assert limiter.allow() is False


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0), ("250us", 0.00025), (0, 0.0), ("0", 0.0)],
)
def test_go_durations_are_read_as_go_reads_them(text: str | int, seconds: float) -> None:
    assert parse_go_duration(text, "k") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1", "1 s", "s", "1d", "1sec", True])
def test_go_durations_without_a_valid_unit_are_refused(text: str | bool) -> None:
    with pytest.raises(WebConfigError, match=r"^k: "):
        parse_go_duration(text, "k")


def test_several_preferred_curves_are_applied_as_the_first_with_a_note(certs: Certs, tmp_path: Path) -> None:
    path = _write(tmp_path, {"tls_server_config": _tls(certs, curve_preferences=["CurveP384", "X25519"])})
    config = load_web_config(path)
    assert config.tls is not None and config.tls.curve == "secp384r1"
    assert config.notes == [
        "tls_server_config.curve_preferences: Python's ssl can offer one curve only; offering CurveP384, not X25519"
    ]
