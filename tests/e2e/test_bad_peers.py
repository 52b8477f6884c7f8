"""Load and bad peers on loopback: a scraper keeps getting every /metrics within 1 s meanwhile.

Every test is bounded: its peers and its scraper stop on their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
import yaml

from tests.conftest import FIXTURES, ROOT, Daemon, StartDaemon, free_port, wait_until
from tests.tls_helpers import bcrypt_hash, make_certs

BASE = ("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1s", "--web.header-timeout", "2s")


@contextmanager
def scraper(d: Daemon, period: float = 0.1) -> Iterator[list[tuple[int, float]]]:
    """Scrape /metrics every `period` seconds in the background; yields (status, seconds) per scrape."""
    results: list[tuple[int, float]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                status = d.get("/metrics", timeout=1.0).status_code
            except requests.RequestException:
                status = -1
            results.append((status, time.monotonic() - started))
            stop.wait(period)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield results
    finally:
        stop.set()
        thread.join()


SCRAPES = 10  # what each test wants served while its bad peers are connected


def _wait_for_scrapes(results: list[tuple[int, float]]) -> None:
    """Keep the bad peers connected until the scraper has finished SCRAPES scrapes (a loaded machine is slower)."""
    wait_until(lambda: len(results) >= SCRAPES, timeout=30, what=f"{SCRAPES} scrapes", step=0.05)


def _assert_all_served(results: list[tuple[int, float]]) -> None:
    assert len(results) >= SCRAPES, results
    bad = [r for r in results if r[0] != 200 or r[1] >= 1.0]
    assert not bad, f"{len(bad)} of {len(results)} scrapes failed or took >= 1 s: {bad[:5]}"


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes `sock` within `within` seconds (it may answer an error first)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_500_idle_connections_do_not_delay_scrapes_and_are_closed(start_daemon: StartDaemon) -> None:
    d = start_daemon(*BASE)
    fds_before = _open_fds(d.proc.pid)
    idle = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(500)]
    try:
        with scraper(d) as results:
            _wait_for_scrapes(results)
        _assert_all_served(results)
        # The header timeout (2 s) closes every connection that never sent a request.
        assert all(_closed_by_server(s, within=5.0) for s in idle)
    finally:
        for s in idle:
            s.close()
    wait_until(
        lambda: _open_fds(d.proc.pid) <= fds_before + 5,
        timeout=5,
        what="idle connections' fds released",
        step=0.2,
        detail=lambda: f"fds {fds_before} -> {_open_fds(d.proc.pid)}",
    )


def test_slowloris_clients_are_dropped_while_scrapes_go_on(start_daemon: StartDaemon) -> None:
    d = start_daemon(*BASE)
    slow = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(50)]
    dropped: list[bool] = [False] * len(slow)

    def trickle(i: int, s: socket.socket) -> None:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        for _ in range(8):  # a byte every 0.7 s, for at most ~6 s
            time.sleep(0.7)
            try:
                s.sendall(b"a")
            except OSError:
                dropped[i] = True
                return
        dropped[i] = _closed_by_server(s, within=0.1)

    threads = [threading.Thread(target=trickle, args=(i, s)) for i, s in enumerate(slow)]
    with scraper(d) as results:
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
    for s in slow:
        s.close()
    _assert_all_served(results)
    assert all(dropped), f"{dropped.count(False)} slow clients were never dropped"


def test_tls_peers_that_never_say_hello_do_not_block_anyone(start_daemon: StartDaemon, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}})
    )
    d = start_daemon(*BASE, "--web.config.file", str(web), scheme="https", client={"verify": str(certs.server_ca)})
    mute = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(100)]
    try:
        with scraper(d) as results:
            _wait_for_scrapes(results)
        _assert_all_served(results)
        # The handshake timeout (the header timeout, 2 s) closes them.
        assert all(_closed_by_server(s, within=6.0) for s in mute)
    finally:
        for s in mute:
            s.close()


def _raw_exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def test_oversized_headers_and_garbage_get_errors_and_scrapes_go_on(start_daemon: StartDaemon) -> None:
    d = start_daemon(*BASE)
    oversized = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    garbage = [
        os.urandom(512),
        b"\x16\x03\x01\x02\x00" + os.urandom(64),
        b"GET /\x00 HTTP/1.1\r\n\r\n",
        b"BREW /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\r\n\r\n\r\n",
    ]
    with scraper(d) as results:
        answer = _raw_exchange(d.port, oversized)
        assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"413", b"431"), answer[:100]
        for g in garbage:
            reply = _raw_exchange(d.port, g)
            assert reply == b"" or reply.split(b" ", 2)[1] in (b"400", b"405", b"404", b"505"), reply[:100]
        _wait_for_scrapes(results)
    _assert_all_served(results)
    assert d.proc.poll() is None


def test_requests_past_the_limit_are_answered_503_at_once(start_daemon: StartDaemon, tmp_path: Path) -> None:
    # bcrypt at cost 12 keeps each authenticated request in flight for a while, so two fill the limit.
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": bcrypt_hash("pw", rounds=12)}}))
    d = start_daemon(*BASE, "--web.config.file", str(web), "--web.max-requests", "2", client={"auth": ("prom", "pw")})
    statuses: list[int] = []
    lock = threading.Lock()

    def hit(i: int) -> None:
        r = requests.get(d.url + "/readyz", auth=("prom", f"wrong-{i}"), timeout=30)  # uncached: full bcrypt
        with lock:
            statuses.append(r.status_code)

    threads: list[threading.Thread] = [threading.Thread(target=hit, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert 503 in statuses and 401 in statuses, statuses
    assert set(statuses) <= {401, 503}


JUNK = [
    b"GET /\r\n",  # HTTP/0.9
    b"SSH-2.0-OpenSSH_9.6\r\n",
    b"hello world, no request line here",
    b"Z" + bytes(b % 0x5E + 0x21 for b in os.urandom(300)),  # printable random bytes, no line end
    b"GET /metrics HTTP/1.1 trailing\r\n",
]


def test_junk_gets_a_400_and_a_close_without_waiting_for_the_header_timeout(start_daemon: StartDaemon) -> None:
    d = start_daemon("--replay", str(FIXTURES / "shapes.json"), "--web.header-timeout", "10s")
    for junk in JUNK:
        with socket.create_connection(("127.0.0.1", d.port)) as s:
            s.sendall(junk)  # and keep the connection open, as a confused client would
            s.settimeout(3.0)  # well under the 10 s header timeout: the answer must not wait for it
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 400 "), (junk, reply[:100])
        assert b"connection: close" in reply.lower()
    assert d.get("/metrics").status_code == 200


def test_at_the_descriptor_limit_accept_errors_are_logged_once_a_second_and_scrapes_recover(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "daemon.log"

    # The limit is set by a small interpreter that then execs the daemon, not by a preexec_fn: that would make
    # Popen fork this test process, which has JAX's threads running (the unit tests imported it).
    limited = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                limited,
                "-m",
                "jaxmon",
                "serve",
                "--web.listen-address",
                f"127.0.0.1:{port}",
                *BASE[:4],
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "JAX_NUM_CPU_DEVICES": "8"},
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        time.sleep(4.0)
        for s in idle:
            s.close()
        text = log_path.read_text()
        reports = [json.loads(line) for line in text.splitlines() if "cannot accept connections" in line]
        assert 1 <= len(reports) <= 6, text[-3000:]  # about one a second over 4 s
        assert sum(r["errors_since_last_report"] for r in reports) <= reports[-1]["errors_total"]
        assert reports[-1]["errors_total"] > len(reports)  # many errors, few lines
        assert "Traceback" not in text and len(text) < 20_000, len(text)
        deadline = time.monotonic() + 10  # asyncio retries accepting after 1 s
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/metrics", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
