"""`jaxmon top --once` against real endpoints: replay daemons over HTTP and HTTPS, an embedded workload, NVML's
processes, and loopback peers that are no jaxmon (not HTTP, a certificate for another name, a hung endpoint).

Parsing and rendering of literal expositions are tests/unit/test_top.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from jaxmon.top import main as top_main
from tests.conftest import FIXTURES, ROOT, StartDaemon, sample
from tests.fakenvml import Scenario, device
from tests.helpers import Child, wait_for_samples
from tests.tls_helpers import bcrypt_hash, make_certs
from tests.unit.test_top import _cells, _process_table

MiB = 1 << 20
GiB = 1 << 30
SHAPES = FIXTURES / "shapes.json"
REPLAY = ("--replay", str(SHAPES), "--poll.interval", "1s")


def _top(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxmon", "top", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def _gib(n: float) -> str:
    return f"{n / GiB:.1f}GiB"


def _replay_device(device: int) -> dict[str, Any]:
    doc = json.loads(SHAPES.read_text())
    return next(d["memory_stats"] for d in doc["devices"] if d["id"] == device)


@contextlib.contextmanager
def _peer(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A loopback port whose every connection `answer` handles, then closes: a peer that is no jaxmon."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)

        def serve() -> None:
            with contextlib.suppress(OSError):  # the socket closed under accept(): the test is over
                while True:
                    conn, _ = server.accept()
                    with conn, contextlib.suppress(OSError):  # ssl.SSLError is one: the client gave up
                        answer(conn)

        threading.Thread(target=serve, daemon=True).start()
        yield server.getsockname()[1]


def _says(answer: bytes) -> Callable[[socket.socket], None]:
    """Read the request, then send `answer` (closing with the request unread would reset the connection)."""

    def answer_it(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(answer)

    return answer_it


def _header(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The first endpoint's header line of `jaxmon top --once ARGS`, run in this process; it must be down."""
    assert top_main([*args, "--once", "--timeout", "5s"]) == 1
    return capsys.readouterr().out.splitlines()[0]


def test_a_peer_that_does_not_speak_http_is_down_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with _peer(_says(b"SSH-2.0-OpenSSH_9.2\r\n")) as port:
        line = _header(capsys, f"127.0.0.1:{port}")
    assert line == f"127.0.0.1:{port}  DOWN: not an HTTP answer (BadStatusLine: 'SSH-2.0-OpenSSH_9.2')"
    # A TLS alert (protocol_version) in answer to plain HTTP: a TLS server, so the hint to use https.
    with _peer(_says(b"\x15\x03\x01\x00\x02\x02\x46")) as port:
        line = _header(capsys, f"127.0.0.1:{port}")
    hint = f"if it serves HTTPS, use https://127.0.0.1:{port}"
    assert line == f"127.0.0.1:{port}  DOWN: answered in TLS, not plain HTTP: {hint}"


def test_a_certificate_for_another_name_is_reported_as_that_not_as_an_untrusted_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("other.example").configure_cert(server)
    with _peer(lambda conn: server.wrap_socket(conn, server_side=True).close()) as port:
        by_ip = _header(capsys, f"https://127.0.0.1:{port}", "--ca-file", str(tmp_path / "ca.pem"))
        by_name = _header(capsys, f"https://localhost:{port}", "--ca-file", str(tmp_path / "ca.pem"))
    assert by_ip.endswith("DOWN: TLS: IP address mismatch, certificate is not valid for '127.0.0.1'.")
    assert by_name.endswith("DOWN: TLS: Hostname mismatch, certificate is not valid for 'localhost'.")


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A loopback port that accepts connections and never answers (a hung daemon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_once_prints_the_replayed_numbers_as_plain_text_and_a_hung_endpoint_times_out(
    start_daemon: StartDaemon, silent_endpoint: str
) -> None:
    d = start_daemon(*REPLAY)
    result = _top(f"127.0.0.1:{d.port}", "--once", "--timeout", "1s")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout  # piped: no colour, no cursor movement
    assert all(line == line.rstrip() for line in result.stdout.splitlines())
    # gpu:0 is BFC with a pool: fragmentation = 1 - largest free block / (pool - in use).
    g0 = _replay_device(0)
    free = g0["bytes_limit"] - g0["bytes_in_use"]
    frag = 1 - g0["largest_free_block_bytes"] / (g0["pool_bytes"] - g0["bytes_in_use"])
    allocatable = max(g0["largest_free_block_bytes"], g0["bytes_limit"] - g0["pool_bytes"])
    filled = round(10 * g0["bytes_in_use"] / g0["bytes_limit"])
    assert _cells(result.stdout, "gpu:0")[2:9] == [
        "#" * filled + "." * (10 - filled),
        f"{_gib(g0['bytes_in_use'])}/{_gib(g0['bytes_limit'])}",
        "-",  # reserved: a GPU's BFC allocator keeps no stack (the column is there for the replay's TPU)
        _gib(free),
        f"{frag * 100:.1f}%",
        _gib(allocatable),
        "-",  # no NVML on a replay
    ]
    # tpu:3 has no pool: the free memory in the allocator is limit - in use.
    t3 = _replay_device(3)
    t3_frag = 1 - t3["largest_free_block_bytes"] / (t3["bytes_limit"] - t3["bytes_in_use"])
    assert _cells(result.stdout, "tpu:3")[5:7] == [
        _gib(t3["bytes_limit"] - t3["bytes_in_use"]),
        f"{t3_frag * 100:.1f}%",
    ]
    assert _cells(result.stdout, "gpu:2")[6:8] == ["-", "-"]  # cuda_async: fragmentation and headroom absent
    assert _cells(result.stdout, "gpu:6")[-1] == "read-error"
    assert f"127.0.0.1:{d.port}  healthy (ok:" in result.stdout

    # With a hung endpoint beside it, the frame still comes (after the timeout) and says which one hung.
    both = _top(silent_endpoint, f"127.0.0.1:{d.port}", "--once", "--timeout", "500ms")
    assert both.returncode == 1
    assert f"{silent_endpoint}  DOWN: timed out after 0.5s" in both.stdout
    assert _cells(both.stdout, "gpu:0")[3] == f"{_gib(g0['bytes_in_use'])}/{_gib(g0['bytes_limit'])}"
    assert "PID" not in both.stdout  # a replay has no NVML: no process table

    # https:// to this plain HTTP endpoint: the TLS handshake reads an HTTP answer.
    tls = _top(f"https://127.0.0.1:{d.port}", "--once")
    assert f"DOWN: TLS: WRONG_VERSION_NUMBER: if it serves plain HTTP, use http://127.0.0.1:{d.port}" in tls.stdout


def test_once_shows_a_workloads_live_arrays_on_its_cpu_devices_and_sorts_by_them(tmp_path: Path) -> None:
    # A training process with jaxmon embedded, on 8 CPU devices: memory_stats() is None, live arrays are all there is.
    child = Child(tmp_path, "embedded", "--workload", "toy", env={"JAXMON_COLLECTOR__PROBE": "false"})
    try:
        child.send(f"alloc 3 {78 * MiB}")
        child.send(f"alloc 5 {MiB}")
        url = child.hello["url"]
        wait_for_samples(
            url,
            lambda s: sample(s, "jaxmon_memory_live_array_bytes", device="5", platform="cpu", workload="toy") == MiB,
            "the arrays in jaxmon_memory_live_array_bytes",
        )
        result = _top(url, "--once", "--sort", "memory")
    finally:
        child.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert _cells(result.stdout, "cpu:3")[2:5] == ["toy", "78.0MiB", "live"]
    assert _cells(result.stdout, "cpu:5")[2:5] == ["toy", "1.0MiB", "live"]
    # The toy loop's own state on cpu:0: 4 * (256 * 64 + 256 + 64 + 1) B (tests/e2e/test_workloads.py).
    assert _cells(result.stdout, "cpu:0")[2:5] == ["toy", "65.3KiB", "live"]
    devices = [cells[1] for line in result.stdout.splitlines() if len(cells := line.split()) > 1 and ":" in cells[1]]
    assert devices[:3] == ["cpu:3", "cpu:5", "cpu:0"]  # the largest first


def test_once_lists_nvml_processes_largest_first_and_says_how_many_more(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    # Twelve processes over two GPUs; process k holds k + 1 GiB.
    procs = [[{"pid": 3000 + k, "used": (k + 1) * GiB} for k in range(12) if k % 2 == gpu] for gpu in (0, 1)]
    scenario = Scenario(tmp_path / "scenario.json", [device(0, processes=procs[0]), device(1, processes=procs[1])])
    d = start_daemon("--no-collector.probe", "--poll.interval", "0.3s", "--collector.nvml", env=scenario.env())
    d.wait_for(lambda s: len([k for k in s if k[0] == "jaxmon_process_device_memory_bytes"]) == 12, what="12 processes")
    result = _top(f"127.0.0.1:{d.port}", "--once")
    assert result.returncode == 0, result.stdout + result.stderr
    rows, more = _process_table(result.stdout)
    assert rows == [
        [f"127.0.0.1:{d.port}", f"gpu:{k % 2}", str(3000 + k), "-", f"{k + 1}.0GiB"] for k in range(11, 1, -1)
    ]
    assert more == "2 more processes not shown"


def test_https_with_a_ca_file_and_basic_auth_and_what_each_mistake_says(
    start_daemon: StartDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)},
                "basic_auth_users": {"prom": bcrypt_hash("s3cret")},
            }
        )
    )
    d = start_daemon(
        *REPLAY,
        "--web.config.file",
        str(web),
        scheme="https",
        client={"verify": str(certs.server_ca), "auth": ("prom", "s3cret")},
    )
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    url = f"https://127.0.0.1:{d.port}/metrics"
    ok = _top(url, "--once", "--ca-file", str(certs.server_ca), "--user", "prom", "--password-file", str(password))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    g0 = _replay_device(0)
    assert _cells(ok.stdout, "gpu:0")[3] == f"{_gib(g0['bytes_in_use'])}/{_gib(g0['bytes_limit'])}"
    assert f"https://127.0.0.1:{d.port}  healthy (ok:" in ok.stdout  # /healthz was read with the same credentials

    def reason(*args: str) -> str:
        """What the endpoint's header line says after DOWN."""
        return _header(capsys, *args).split("  DOWN: ", 1)[1]

    wrong = tmp_path / "wrong"
    wrong.write_text("guess")
    auth = ("--user", "prom", "--password-file")
    ca = ("--ca-file", str(certs.server_ca))
    assert reason(url, *ca, *auth, str(wrong)) == "HTTP 401: unauthorized (check --user and the password)"
    assert reason(url, *ca) == "HTTP 401: unauthorized (it needs --user and --password-file)"
    untrusted = "TLS: certificate not trusted (unable to get local issuer certificate)"
    assert reason(url, *auth, str(password)) == f"{untrusted}: pass its CA with --ca-file"
    assert reason(url, "--ca-file", str(certs.client_ca), *auth, str(password)) == (
        f"{untrusted}: --ca-file {certs.client_ca} did not sign it"
    )
    # A plain http:// request to the TLS port: the server hangs up without a word, which says nothing by itself.
    assert reason(f"127.0.0.1:{d.port}", *auth, str(password)) == (
        f"the connection was closed without an HTTP answer: if it serves HTTPS, use https://127.0.0.1:{d.port}"
    )
