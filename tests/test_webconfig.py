"""The web config file: a table of good and bad files with the expected error for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from jaxmon.web.webconfig import BasicAuth, WebConfigError, load_web_config
from tests.tls_helpers import Certs, bcrypt_hash, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


def _tls(certs: Certs, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key), **extra}


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
        "policy without client CA",
        lambda c: {"tls_server_config": _tls(c, client_auth_type="RequireAndVerifyClientCert")},
        "client_auth_type RequireAndVerifyClientCert needs client_ca_file",
    ),
    (
        "unknown client auth type",
        lambda c: {"tls_server_config": _tls(c, client_auth_type="Sometimes")},
        "tls_server_config.client_auth_type: unknown client_auth_type 'Sometimes'",
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
        "tls_server_config.key_file: Field required",
    ),
    (
        "certificate that does not exist",
        lambda c: {"tls_server_config": _tls(c, cert_file="/nonexistent.pem")},
        "cannot load /nonexistent.pem",
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
        "header 'Content-Type' is set by jaxmon",
    ),
    (
        "unknown http_server_config key",
        lambda c: {"http_server_config": {"http2": True}},
        "http_server_config.http2: unknown key",
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


def test_an_unknown_user_costs_one_bcrypt_check_like_a_wrong_password(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = BasicAuth({"prom": bcrypt_hash("secret")})
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return bool(real(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    assert auth.check("prom", "wrong") is False
    assert auth.check("nobody", "wrong") is False
    assert len(calls) == 2
    # The unknown user was checked against a hash of the same cost as the real one.
    assert calls[0][:7] == calls[1][:7] == b"$2b$04$"
    assert auth.check("prom", "secret") is True
    assert auth.check("prom", "secret") is True  # cached: no third bcrypt run
    assert len(calls) == 3
