"""The real daemon behind TLS, mTLS and basic auth (certificates made by the tests), and web config reloads."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import FIXTURES, Daemon, StartDaemon, wait_until
from tests.tls_helpers import bcrypt_hash, make_certs

REPLAY = ("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1s")


def _web(tmp_path: Path, doc: dict[str, object]) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _handshake(
    port: int, ca: Path, cert: tuple[Path, Path] | None = None, max_version: ssl.TLSVersion | None = None
) -> str:
    """A raw TLS handshake plus one request; returns the status line or raises ssl.SSLError/OSError."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if max_version is not None:
        ctx.maximum_version = max_version
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = tls.recv(1024)
        if not data:
            raise ConnectionError("closed without an answer")  # TLS 1.3 reports a rejected cert after the handshake
        return data.split(b"\r\n", 1)[0].decode()


def test_tls_serves_https_only_with_the_configured_certificate(start_daemon: StartDaemon, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    web = _web(
        tmp_path, {"tls_server_config": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}}
    )
    d = start_daemon(*REPLAY, "--web.config.file", str(web), scheme="https", client={"verify": str(certs.server_ca)})
    assert d.get("/metrics").status_code == 200
    assert "jaxmon_memory_bytes_in_use" in d.get("/metrics").text
    with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust our CA
        requests.get(d.url + "/metrics", timeout=5)
    with pytest.raises(requests.ConnectionError):  # plain HTTP to the TLS port
        requests.get(f"http://127.0.0.1:{d.port}/metrics", timeout=5)


def test_mtls_requires_a_client_certificate_from_the_client_ca(start_daemon: StartDaemon, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    web = _web(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(certs.server_cert),
                "key_file": str(certs.server_key),
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": str(certs.client_ca),
            }
        },
    )
    client = {"verify": str(certs.server_ca), "cert": (str(certs.client_cert), str(certs.client_key))}
    d = start_daemon(*REPLAY, "--web.config.file", str(web), scheme="https", client=client)
    assert _handshake(d.port, certs.server_ca, (certs.client_cert, certs.client_key)) == "HTTP/1.1 200 OK"
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _handshake(d.port, certs.server_ca)  # no client certificate
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _handshake(d.port, certs.server_ca, (certs.stranger_cert, certs.stranger_key))  # wrong CA
    assert d.get("/metrics").status_code == 200


def test_min_version_refuses_older_clients(start_daemon: StartDaemon, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    web = _web(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(certs.server_cert),
                "key_file": str(certs.server_key),
                "min_version": "TLS13",
            }
        },
    )
    d = start_daemon(*REPLAY, "--web.config.file", str(web), scheme="https", client={"verify": str(certs.server_ca)})
    assert _handshake(d.port, certs.server_ca).startswith("HTTP/1.1 200")
    with pytest.raises(ssl.SSLError):
        _handshake(d.port, certs.server_ca, max_version=ssl.TLSVersion.TLSv1_2)


def test_basic_auth_and_configured_headers(start_daemon: StartDaemon, tmp_path: Path) -> None:
    web = _web(
        tmp_path,
        {
            "basic_auth_users": {"prom": bcrypt_hash("s3cret")},
            "http_server_config": {
                "headers": {"X-Content-Type-Options": "nosniff", "Strict-Transport-Security": "max-age=1"}
            },
        },
    )
    d = start_daemon(*REPLAY, "--web.config.file", str(web), client={"auth": ("prom", "s3cret")})
    ok = d.get("/metrics")
    assert ok.status_code == 200
    assert ok.headers["X-Content-Type-Options"] == "nosniff"
    assert ok.headers["Strict-Transport-Security"] == "max-age=1"
    for auth in (None, ("prom", "wrong"), ("nobody", "s3cret")):
        r = requests.get(d.url + "/metrics", auth=auth, timeout=10)
        assert r.status_code == 401, auth
        assert r.headers["WWW-Authenticate"].startswith("Basic realm=")
        assert "jaxmon_" not in r.text
    r = requests.get(d.url + "/metrics", headers={"Authorization": "Basic !!notbase64"}, timeout=10)
    assert r.status_code == 401
    assert requests.get(d.url + "/healthz", timeout=10).status_code == 401  # every path is protected


def test_web_config_changes_are_picked_up_and_a_broken_edit_keeps_the_last_good(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    web = _web(tmp_path, {"basic_auth_users": {"alice": bcrypt_hash("a")}})
    d = start_daemon(*REPLAY, "--web.config.file", str(web), client={"auth": ("alice", "a")})

    def status(user: str, password: str) -> int:
        return requests.get(d.url + "/readyz", auth=(user, password), timeout=10).status_code

    web.write_text(yaml.safe_dump({"basic_auth_users": {"bob": bcrypt_hash("b")}}))
    wait_until(lambda: status("bob", "b") == 200, timeout=15, what="bob admitted", step=0.2, detail=d.log)
    assert status("alice", "a") == 401
    web.write_text("basic_auth_users: {bob: not-a-hash}\n")
    wait_until(lambda: "web config not reloaded" in d.log(), timeout=15, what="the broken edit reported", step=0.2)
    assert status("bob", "b") == 200  # still the last good config
    assert "password of user 'bob' is not a bcrypt hash" in d.log()


def test_certificates_rotate_without_a_restart(start_daemon: StartDaemon, tmp_path: Path) -> None:
    first = make_certs(tmp_path, "-1")
    second = make_certs(tmp_path, "-2")
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(first.server_cert.read_bytes())
    key.write_bytes(first.server_key.read_bytes())
    web = _web(tmp_path, {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}})
    d = start_daemon(*REPLAY, "--web.config.file", str(web), scheme="https", client={"verify": str(first.server_ca)})
    assert _handshake(d.port, first.server_ca).startswith("HTTP/1.1 200")
    key.write_bytes(second.server_key.read_bytes())
    cert.write_bytes(second.server_cert.read_bytes())

    def second_served() -> bool:
        try:
            return _handshake(d.port, second.server_ca).startswith("HTTP/1.1 200")
        except ssl.SSLError:
            return False

    wait_until(second_served, timeout=15, what="the new certificate served", step=0.2, detail=d.log)
    with pytest.raises(ssl.SSLError):
        _handshake(d.port, first.server_ca)


def _wait_log(d: Daemon, text: str, timeout: float = 15.0) -> None:
    wait_until(lambda: text in d.log(), timeout=timeout, what=f"{text!r} logged", step=0.1, detail=d.log)


def test_a_client_of_a_removed_ca_is_refused_after_the_reload(start_daemon: StartDaemon, tmp_path: Path) -> None:
    a, b = make_certs(tmp_path, "-a"), make_certs(tmp_path, "-b")
    bundle = tmp_path / "clients.pem"
    bundle.write_bytes(a.client_ca.read_bytes() + b.client_ca.read_bytes())
    tls = {"cert_file": str(a.server_cert), "key_file": str(a.server_key)}
    web = _web(
        tmp_path,
        {"tls_server_config": {**tls, "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(bundle)}},
    )
    client_b = {"verify": str(a.server_ca), "cert": (str(b.client_cert), str(b.client_key))}
    d = start_daemon(*REPLAY, "--web.config.file", str(web), scheme="https", client=client_b)
    assert _handshake(d.port, a.server_ca, (a.client_cert, a.client_key)) == "HTTP/1.1 200 OK"
    bundle.write_bytes(b.client_ca.read_bytes())  # CA a is removed
    _wait_log(d, "web config reloaded")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _handshake(d.port, a.server_ca, (a.client_cert, a.client_key))
    assert _handshake(d.port, a.server_ca, (b.client_cert, b.client_key)) == "HTTP/1.1 200 OK"


def test_an_emptied_or_half_written_web_config_keeps_tls_and_basic_auth(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    certs = make_certs(tmp_path)
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    full = yaml.safe_dump({"tls_server_config": tls, "basic_auth_users": {"prom": bcrypt_hash("pw")}})
    web = tmp_path / "web.yml"
    web.write_text(full)
    d = start_daemon(
        *REPLAY,
        "--web.config.file",
        str(web),
        scheme="https",
        client={"verify": str(certs.server_ca), "auth": ("prom", "pw")},
    )
    web.write_text("")  # emptied, as by `> web.yml` or an editor truncating before it writes
    _wait_log(d, "the new file turns TLS off")
    assert requests.get(d.url + "/metrics", verify=str(certs.server_ca), timeout=10).status_code == 401
    assert d.get("/metrics").status_code == 200
    web.write_text(yaml.safe_dump({"tls_server_config": tls}))  # a rewrite caught half way: TLS, no users yet
    _wait_log(d, "the new file turns basic auth off")
    assert requests.get(d.url + "/metrics", verify=str(certs.server_ca), timeout=10).status_code == 401
    web.write_text(full.replace("prom", "prometheus"))  # the rewrite completes: applied
    _wait_log(d, "web config reloaded")
    assert d.get("/metrics", auth=("prometheus", "pw")).status_code == 200
    assert 'level": "error' in d.log()


def test_sighup_reloads_the_web_config_and_sigusr1_is_ignored(start_daemon: StartDaemon, tmp_path: Path) -> None:
    web = _web(tmp_path, {"basic_auth_users": {"alice": bcrypt_hash("a")}})
    d = start_daemon(*REPLAY, "--web.config.file", str(web), client={"auth": ("alice", "a")})
    d.proc.send_signal(signal.SIGUSR1)
    _wait_log(d, '"signal ignored"')
    assert d.proc.poll() is None and d.get("/readyz").status_code == 200
    d.proc.send_signal(signal.SIGHUP)
    _wait_log(d, '"reason": "SIGHUP"')
    assert d.proc.poll() is None
    log_lines = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    assert any(e["event"] == "web config reloaded" and e.get("reason") == "SIGHUP" for e in log_lines), d.log()
    assert d.get("/readyz").status_code == 200


def test_sighup_without_a_web_config_keeps_serving(start_daemon: StartDaemon) -> None:
    d = start_daemon(*REPLAY)
    d.proc.send_signal(signal.SIGHUP)
    _wait_log(d, "no web config file to reload")
    assert d.proc.poll() is None and d.get("/readyz").status_code == 200


def test_unknown_users_cannot_starve_a_valid_scrape(start_daemon: StartDaemon) -> None:
    """exporter-toolkit's users file (bob's hash costs 18: 12.6 s a check here): 20 concurrent requests for unknown
    users leave a valid scrape (dave, checked once and cached) answering within 1 s, and are refused themselves."""
    users = FIXTURES / "etk" / "web_config_users_noTLS.good.yml"
    d = start_daemon(*REPLAY, "--web.config.file", str(users), client={"auth": ("dave", "dave123")})
    assert d.get("/metrics").status_code == 200  # dave's password is checked now and cached from here on
    with ThreadPoolExecutor(max_workers=20) as pool:
        strangers = [
            pool.submit(requests.get, d.url + "/metrics", auth=(f"mallory{i}", "guess"), timeout=60) for i in range(20)
        ]
        time.sleep(0.3)  # all twenty are in: checking, queued, or refused
        started = time.monotonic()
        scrape = d.get("/metrics")
        elapsed = time.monotonic() - started
        statuses = sorted(f.result().status_code for f in strangers)
    assert scrape.status_code == 200 and "jaxmon_memory_bytes_in_use" in scrape.text
    assert elapsed < 1.0, f"a valid scrape took {elapsed:.2f}s beside 20 unknown users"
    # At most 8 checks wait for the bcrypt thread; the rest are refused at once (503, retry), none let in.
    assert set(statuses) <= {401, 503} and statuses.count(401) >= 1, statuses
    assert requests.get(d.url + "/metrics", auth=("nobody", "x"), timeout=30).status_code == 401
