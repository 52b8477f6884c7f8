"""exporter-toolkit's own test data through jaxmon's web config loader, with the outcomes the toolkit's Go tests
expect.

The files are in tests/fixtures/etk (see the README there). Each load case is one file through `load_web_config`.
Where jaxmon deliberately disagrees, the case says why; docs/security.md has the same list. The daemon serving
these files to real TLS/HTTP clients is tests/e2e/test_etk_conformance.py.
"""

from __future__ import annotations

import pytest

from jaxmon.web.config_error import WebConfigError
from jaxmon.web.webconfig import load_web_config
from tests.conftest import FIXTURES

ETK = FIXTURES / "etk"
ANY_CLIENT = "RequireAnyClientCert is not supported"
CIPHERS = "cipher_suites is not supported"
WHY_ANY_CLIENT = "Python's ssl verifies every client certificate it asks for: no unverified client certificates"
WHY_CIPHERS = "Python cannot choose TLS 1.3 suites; jaxmon keeps Python's forward-secret TLS 1.2 defaults"

# (file, the toolkit accepts it, what jaxmon's error says (None: accepted), why jaxmon differs (None: it agrees))
LOAD: list[tuple[str, bool, str | None, str | None]] = [
    ("tls_config_noAuth.requireandverifyclientcert.good.yml", True, None, None),
    ("tls_config_noAuth.requireanyclientcert.good.yml", True, ANY_CLIENT, WHY_ANY_CLIENT),
    ("tls_config_noAuth.requireanyclientcertkeyinline.good.yml", True, ANY_CLIENT, WHY_ANY_CLIENT),
    ("web_config_auth_clientCAs_invalid.bad.yml", False, "failed to read client_ca_file", None),
    ("web_config_auth_clientCAs_missing.bad.yml", True, None, None),  # verifies against the system roots
    ("web_config_auth_client_san.bad.yaml", True, None, None),  # refused at the handshake, below
    ("web_config_auth_client_san.good.yaml", True, None, None),
    ("web_config_auth_user_list_invalid.bad.yml", False, "password of user 'john' is not a bcrypt hash", None),
    ("web_config_empty.yml", True, None, None),
    ("web_config_headers.good.yml", True, None, None),
    ("web_config_headers_content_type_options.bad.yml", False, "invalid value for X-Content-Type-Options", None),
    ("web_config_headers_extra_header.bad.yml", False, "HTTP header 'Content-Type' can not be configured", None),
    ("web_config_headers_frame_options.bad.yml", False, "invalid value for X-Frame-Options", None),
    ("web_config_junk.yml", False, "must be a mapping", None),
    ("web_config_junk_key.yml", False, "tls_server_config.cert_filse: unknown key", None),
    ("web_config_noAuth.bad.yml", False, "client CA's have been configured without a Client Auth Policy", None),
    ("web_config_noAuth.good.blocking.yml", True, None, None),
    ("web_config_noAuth.good.yml", True, None, None),
    ("web_config_noAuth_allCiphers.good.yml", True, CIPHERS, WHY_CIPHERS),
    ("web_config_noAuth_allCurves.good.yml", True, None, None),
    ("web_config_noAuth_certPath_empty.bad.yml", False, "missing one of cert or cert_file", None),
    ("web_config_noAuth_certPath_invalid.bad.yml", False, "failed to read cert_file", None),
    ("web_config_noAuth_certPath_keyPath_empty.bad.yml", False, "missing one of cert or cert_file", None),
    ("web_config_noAuth_certPath_keyPath_invalid.bad.yml", False, "failed to read cert_file", None),
    ("web_config_noAuth_cert_empty.bad.yml", False, "missing one of cert or cert_file", None),
    ("web_config_noAuth_inventedCiphers.bad.yml", False, "unknown cipher", None),
    ("web_config_noAuth_inventedCurves.bad.yml", False, "unknown curve 'CurveP257'", None),
    ("web_config_noAuth_keyPath_empty.bad.yml", False, "missing one of key or key_file", None),
    ("web_config_noAuth_keyPath_invalid.bad.yml", False, "failed to read cert_file", None),
    ("web_config_noAuth_key_empty.bad.yml", False, "missing one of key or key_file", None),
    ("web_config_noAuth_noHTTP2.good.yml", True, CIPHERS, WHY_CIPHERS),
    ("web_config_noAuth_noHTTP2Cipher.bad.yml", False, CIPHERS, None),  # the toolkit fails to serve it
    ("web_config_noAuth_someCiphers.good.yml", True, CIPHERS, WHY_CIPHERS),
    ("web_config_noAuth_someCiphers_noOrder.good.yml", True, CIPHERS, WHY_CIPHERS),
    ("web_config_noAuth_someCurves.good.yml", True, None, None),
    ("web_config_noAuth_tlsInline.good.yml", True, None, None),
    ("web_config_noAuth_wrongTLSVersion.bad.yml", False, "unknown TLS version 'TLS111'", None),
    ("web_config_rate_limiter_nonblocking.yaml", True, None, None),
    ("web_config_rate_limiter_one_second.yaml", True, None, None),
    ("web_config_users.good.yml", True, None, None),
    ("web_config_users_noTLS.good.yml", True, None, None),
]


@pytest.mark.parametrize(("name", "toolkit_accepts", "error", "why"), LOAD, ids=[c[0] for c in LOAD])
def test_each_toolkit_file_is_accepted_or_refused_naming_the_reason(
    name: str, toolkit_accepts: bool, error: str | None, why: str | None
) -> None:
    if error is None:
        load_web_config(ETK / name)
        return
    with pytest.raises(WebConfigError) as err:
        load_web_config(ETK / name)
    assert error in str(err.value)


def test_the_table_covers_every_toolkit_file_and_explains_every_difference() -> None:
    files = {p.name for p in ETK.iterdir() if p.suffix in (".yml", ".yaml")}
    assert files == {c[0] for c in LOAD}
    for name, toolkit_accepts, error, why in LOAD:
        assert (toolkit_accepts != (error is None)) == (why is not None), name
