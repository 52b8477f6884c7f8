"""exporter-toolkit's own test data served by the real daemon, with the outcomes the toolkit's Go tests expect.

The files are in tests/fixtures/etk (see the README there). Each behaviour case is the real daemon serving that
file and a real TLS/HTTP client doing what the toolkit's test (web/tls_config_test.go TestServerBehaviour,
TestUsers, TestConfigReloading) does. Where jaxmon deliberately disagrees, the case says why; docs/security.md has
the same list. Each file through the loader alone is in tests/unit/test_etk_conformance.py.
"""

from __future__ import annotations

import shutil
import ssl
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import FIXTURES, Daemon, StartDaemon
from tests.tls_helpers import tls_request

ETK = FIXTURES / "etk"
SERVER = ETK / "server.crt"
CLIENT = (ETK / "client_selfsigned.pem", ETK / "client_selfsigned.key")
CLIENT2 = (ETK / "client2_selfsigned.pem", ETK / "client2_selfsigned.key")
REPLAY = ("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1s")


def _serve(start_daemon: StartDaemon, file: Path, scheme: str = "https") -> Daemon:
    """The daemon on `file`, once it listens (probes may need credentials the file demands)."""
    d = start_daemon(*REPLAY, "--web.config.file", str(file), ready=False, scheme=scheme, client={"verify": False})
    _wait_logged(d, "serving")
    return d


def _wait_logged(d: Daemon, event: str) -> None:
    """Until the daemon's log has `event` (failing if it exits, or after a minute)."""
    deadline = time.monotonic() + 60
    while f'"{event}"' not in d.log():
        assert d.proc.poll() is None and time.monotonic() < deadline, d.log()
        time.sleep(0.05)


REFUSED = (ssl.SSLError, ConnectionError, OSError)


def test_tls_with_an_optional_client_certificate(start_daemon: StartDaemon) -> None:
    d = _serve(start_daemon, ETK / "web_config_noAuth.good.yml")
    assert tls_request(d.port, pin=SERVER)[0] == 200  # TLS client, no certificate
    with pytest.raises(requests.ConnectionError):  # an HTTP client to the HTTPS port
        requests.get(f"http://127.0.0.1:{d.port}/readyz", timeout=5)
    with pytest.raises(REFUSED):  # a TLS 1.1 client (min_version defaults to TLS12)
        tls_request(d.port, pin=SERVER, max_version=ssl.TLSVersion.TLSv1_1)


@pytest.mark.parametrize("name", ["web_config_noAuth_tlsInline.good.yml", "web_config_noAuth_allCurves.good.yml"])
def test_inline_certificates_and_all_curves_serve_tls(start_daemon: StartDaemon, name: str) -> None:
    d = _serve(start_daemon, ETK / name)
    assert tls_request(d.port, pin=SERVER)[0] == 200


def test_one_curve_preferred_refuses_a_client_without_it(start_daemon: StartDaemon) -> None:
    d = _serve(start_daemon, ETK / "web_config_noAuth_someCurves.good.yml")
    assert tls_request(d.port, pin=SERVER, curve="secp521r1")[0] == 200
    with pytest.raises(REFUSED):
        tls_request(d.port, pin=SERVER, curve="secp384r1")


def test_a_required_client_certificate_from_the_client_ca_is_accepted(start_daemon: StartDaemon) -> None:
    d = _serve(start_daemon, ETK / "tls_config_noAuth.requireandverifyclientcert.good.yml")
    assert tls_request(d.port, pin=SERVER, cert=CLIENT)[0] == 200
    with pytest.raises(REFUSED):
        tls_request(d.port, pin=SERVER)


@pytest.mark.parametrize(("name", "accepted"), [("good", True), ("bad", False)])
def test_client_allowed_sans_are_checked_after_the_handshake(
    start_daemon: StartDaemon, name: str, accepted: bool
) -> None:
    d = _serve(start_daemon, ETK / f"web_config_auth_client_san.{name}.yaml")
    if accepted:  # client2's only SAN is DNS:test3, which the good file lists
        assert tls_request(d.port, pin=SERVER, cert=CLIENT2)[0] == 200
    else:
        with pytest.raises(REFUSED):
            tls_request(d.port, pin=SERVER, cert=CLIENT2)


def test_the_toolkit_headers_file_sets_all_five_headers(start_daemon: StartDaemon) -> None:
    d = _serve(start_daemon, ETK / "web_config_headers.good.yml", scheme="http")
    _wait_logged(d, "ready: first poll done")  # /readyz answers 503 until then (once in a whole run: a loaded poll)
    r = requests.get(d.url + "/readyz", timeout=10)
    assert r.status_code == 200
    expected = yaml.safe_load((ETK / "web_config_headers.good.yml").read_text())["http_server_config"]["headers"]
    for name, value in expected.items():
        assert r.headers[name] == str(value), name


@pytest.mark.parametrize(("name", "status"), [("nonblocking", 200), ("one_second", 429)])
def test_the_toolkit_rate_limits(start_daemon: StartDaemon, name: str, status: int) -> None:
    d = _serve(start_daemon, ETK / f"web_config_rate_limiter_{name}.yaml", scheme="http")
    _wait_logged(d, "ready: first poll done")  # /readyz answers 503 until then
    # As the Go test: 11 requests. interval 0 is no limiter; burst 0 allows nothing (golang.org/x/time/rate).
    assert [requests.get(d.url + "/readyz", timeout=10).status_code for _ in range(11)] == [status] * 11


def test_the_toolkit_users_without_tls(start_daemon: StartDaemon) -> None:
    d = _serve(start_daemon, ETK / "web_config_users_noTLS.good.yml", scheme="http")
    _wait_logged(d, "ready: first poll done")  # /readyz answers 503 until then
    assert requests.get(d.url + "/readyz", timeout=10).status_code == 401
    assert requests.get(d.url + "/readyz", auth=("dave", "dave123"), timeout=10).status_code == 200


def test_the_toolkit_users_over_tls(start_daemon: StartDaemon, tmp_path: Path) -> None:
    # The toolkit's file without bob: bob's cost-18 hash makes an unknown user cost a cost-18 check (~20 s
    # here), as in the toolkit; that load is instant is checked in tests/unit/test_webconfig.py.
    users = yaml.safe_load((ETK / "web_config_users.good.yml").read_text())
    del users["basic_auth_users"]["bob"]
    for pem in ("server.crt", "server.key"):
        shutil.copy(ETK / pem, tmp_path / pem)
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump(users))
    d = _serve(start_daemon, web)
    assert tls_request(d.port, pin=SERVER)[0] == 401
    assert tls_request(d.port, pin=SERVER, auth=("dave", "dave123"))[0] == 200
    assert tls_request(d.port, pin=SERVER, auth=("carol", "carol123"))[0] == 200
    assert tls_request(d.port, pin=SERVER, auth=("dave", "bad"))[0] == 401
    assert tls_request(d.port, pin=SERVER, auth=("nonexistent", "nonexistent"))[0] == 401


def test_a_reload_that_stops_requiring_client_certificates_is_refused(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    # TestConfigReloading swaps the blocking file (RequireAndVerifyClientCert) for the good one
    # (VerifyClientCertIfGiven) and expects the next client without a certificate to get in. jaxmon differs on
    # purpose: a reload never loosens authentication; that takes a restart.
    for pem in ("server.crt", "server.key"):
        shutil.copy(ETK / pem, tmp_path / pem)
    web = tmp_path / "web.yml"
    web.write_text((ETK / "web_config_noAuth.good.blocking.yml").read_text())
    d = _serve(start_daemon, web)
    with pytest.raises(REFUSED):
        tls_request(d.port, pin=SERVER)
    web.write_text((ETK / "web_config_noAuth.good.yml").read_text())
    deadline = time.monotonic() + 15
    while "web config not reloaded" not in d.log():
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.1)
    assert "stops requiring client certificates" in d.log()
    with pytest.raises(REFUSED):
        tls_request(d.port, pin=SERVER)
