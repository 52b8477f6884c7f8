"""The HTTP surface of the real daemon over loopback: what tests/unit/test_web_app.py checks in-process reaches a
real client.

Routing, methods, gzip negotiation, collect[] and readiness are tested in-process (tests/unit/test_web_app.py);
this one daemon checks that hypercorn carries them to the wire unchanged (status, headers, gzip bytes, HEAD without
a body).
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
from collections.abc import Callable
from pathlib import Path

import requests

from tests.conftest import FIXTURES, StartDaemon, sample, wait_until

REPLAY = ("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1h")
PLAIN = {"Accept-Encoding": "identity"}  # requests asks for gzip by default


def test_the_daemon_serves_routes_head_gzip_and_readiness_over_real_http(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """/readyz goes 503 -> 200; then 404, 405 with Allow, HEAD with GET's length and a gzip body on the wire."""
    # The first poll hangs (JAXMON_FAULTS_FILE) until the test lifts the fault: /readyz is 503 for as long as it
    # likes, whatever the machine's speed, and 200 only after.
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"poll_delay_seconds": 600}))
    d = start_daemon(*REPLAY, ready=False, env={"JAXMON_FAULTS_FILE": str(faults)})
    statuses: list[int] = []

    def answered(wanted: int) -> Callable[[], bool]:
        def check() -> bool:
            assert d.alive(), d.log()
            status = d.status("/readyz")
            if status is not None:
                statuses.append(status)
            return status == wanted

        return check

    wait_until(answered(503), timeout=30, what="/readyz answering", step=0.05, detail=d.log)
    for _ in range(3):
        assert d.status("/readyz") == 503  # the poll still hangs: not ready, however often asked
    assert d.get("/readyz").text == "not ready: first poll not complete\n"
    faults.unlink()
    wait_until(answered(200), timeout=30, what="/readyz 200", step=0.05, detail=d.log)
    first = statuses.index(200)
    assert set(statuses[:first]) == {503} and set(statuses[first:]) == {200}, statuses
    assert d.get("/readyz").text == "ready\n"
    # Ready means the first poll landed: the replayed numbers are already exported.
    assert sample(d.scrape(), "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000

    assert d.get("/nope").status_code == 404
    r = requests.post(d.url + "/metrics", timeout=10)
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")

    # collect[] leaves out the process_* families, which are read anew per scrape and change length.
    params = {"collect[]": "memory"}
    body = d.get("/metrics", headers=PLAIN, params=params).content
    head = requests.head(d.url + "/metrics", headers=PLAIN, params=params, timeout=10)
    assert (head.status_code, head.content) == (200, b"")
    assert int(head.headers["content-length"]) == len(body) > 0

    plain = d.get("/metrics", headers=PLAIN)
    assert "content-encoding" not in plain.headers
    r = requests.get(d.url + "/metrics", headers={"Accept-Encoding": "gzip"}, stream=True, timeout=10)
    assert r.headers["content-encoding"] == "gzip"
    raw = r.raw.read(decode_content=False)
    assert raw[:2] == b"\x1f\x8b"  # the bytes on the wire are compressed
    jaxmon_lines = [line for line in gzip.decompress(raw).splitlines() if b"jaxmon_" in line]
    assert jaxmon_lines == [line for line in plain.content.splitlines() if b"jaxmon_" in line]


def _status_line(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        return s.recv(4096).split(b"\r\n", 1)[0]


def test_status_lines_carry_their_reason_phrase(start_daemon: StartDaemon) -> None:
    """`HTTP/1.1 200 OK`, not `HTTP/1.1 200 ` (h11's default when hypercorn builds the response)."""
    d = start_daemon(*REPLAY)
    for path, method, line in (
        (b"/metrics", b"GET", b"HTTP/1.1 200 OK"),
        (b"/nope", b"GET", b"HTTP/1.1 404 Not Found"),
        (b"/metrics", b"POST", b"HTTP/1.1 405 Method Not Allowed"),
    ):
        assert _status_line(d.port, method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") == line
    # An error hypercorn answers itself (a request line h11 refuses) is no different.
    assert _status_line(d.port, b"\x16\x03\x01\x00 junk\r\n\r\n") == b"HTTP/1.1 400 Bad Request"
    # Keep-alive: every response on a connection gets its phrase.
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    reasons = []
    for url in ("/readyz", "/nope", "/metrics"):
        conn.request("GET", url)
        response = conn.getresponse()
        response.read()
        reasons.append((response.status, response.reason))
    conn.close()
    assert reasons == [(200, "OK"), (404, "Not Found"), (200, "OK")]
