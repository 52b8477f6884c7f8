"""The HTTP surface of the real daemon on a replay file: routes, methods, gzip, custom path, no device work."""

from __future__ import annotations

import gzip
import time
from html.parser import HTMLParser

import requests

from tests.conftest import FIXTURES, StartDaemon, parse_samples, sample

REPLAY = ("--replay", str(FIXTURES / "shapes.json"))
PLAIN = {"Accept-Encoding": "identity"}  # requests asks for gzip by default


class LinkParser(HTMLParser):
    """Collects the href of every <a> element."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.extend(value for name, value in attrs if name == "href" and value is not None)


def links_of(page: str) -> list[str]:
    """The link targets of an HTML page."""
    parser = LinkParser()
    parser.feed(page)
    return parser.links


def test_the_landing_page_is_html_linking_metrics_healthz_and_readyz(start_daemon: StartDaemon) -> None:
    """GET / is an HTML page whose links are the telemetry path and the two health endpoints."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    r = d.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert {"/metrics", "/healthz", "/readyz"} <= set(links_of(r.text))


def test_an_unknown_path_is_404(start_daemon: StartDaemon) -> None:
    """Paths outside the four routes are not found, for GET and for other methods alike."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    assert d.get("/nope").status_code == 404
    assert requests.post(d.url + "/nope", timeout=10).status_code == 404


def test_post_to_metrics_is_405_with_an_allow_header(start_daemon: StartDaemon) -> None:
    """Only GET and HEAD are allowed on a known path, and the 405 says so."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    for method in ("POST", "PUT", "DELETE"):
        r = requests.request(method, d.url + "/metrics", timeout=10)
        assert r.status_code == 405, method
        assert r.headers["allow"] == "GET, HEAD"
    assert requests.post(d.url + "/healthz", timeout=10).status_code == 405


def test_head_on_metrics_is_200_with_an_empty_body_and_the_get_length(start_daemon: StartDaemon) -> None:
    """HEAD answers like GET without the body: same status, same Content-Length."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    # The memory collector alone: the process_* families change between any two requests (CPU seconds).
    only = {"collect[]": "memory"}
    body = d.get("/metrics", headers=PLAIN, params=only).content
    r = requests.head(d.url + "/metrics", headers=PLAIN, params=only, timeout=10)
    assert r.status_code == 200
    assert r.content == b""
    assert int(r.headers["content-length"]) == len(body)


def test_metrics_are_gzipped_when_the_client_accepts_gzip(start_daemon: StartDaemon) -> None:
    """Accept-Encoding: gzip gives a gzip body that decompresses to the plain exposition."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    plain = d.get("/metrics", headers=PLAIN)
    assert plain.status_code == 200
    assert "content-encoding" not in plain.headers
    r = requests.get(d.url + "/metrics", headers={"Accept-Encoding": "gzip"}, stream=True, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "gzip"
    raw = r.raw.read(decode_content=False)
    assert raw[:2] == b"\x1f\x8b"  # the gzip magic number: the bytes on the wire are compressed
    # Equal but for the process_* and python_* families, read anew on every scrape (CPU seconds move).
    assert _jaxmon_lines(gzip.decompress(raw)) == _jaxmon_lines(plain.content)
    assert b"\nprocess_resident_memory_bytes " in gzip.decompress(raw)
    assert len(raw) < len(plain.content)


def _jaxmon_lines(body: bytes) -> list[bytes]:
    return [line for line in body.splitlines() if b"jaxmon_" in line]


def test_a_custom_telemetry_path_serves_metrics_there_and_not_at_metrics(start_daemon: StartDaemon) -> None:
    """--web.telemetry-path moves the exposition; /metrics is then unknown and the landing page links the new path."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h", "--web.telemetry-path", "/custom")
    r = d.get("/custom")
    assert r.status_code == 200
    samples = parse_samples(r.text)
    assert sample(samples, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000
    assert d.get("/metrics").status_code == 404
    links = set(links_of(d.get("/").text))
    assert "/custom" in links
    assert "/metrics" not in links


def test_readyz_turns_200_once_the_first_poll_is_done(start_daemon: StartDaemon) -> None:
    """Until the first poll /readyz is 503; then 200, and the data it promises is there."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h", ready=False)
    deadline = time.monotonic() + 30
    statuses: list[int] = []
    while time.monotonic() < deadline:
        try:
            statuses.append(d.get("/readyz").status_code)
        except requests.ConnectionError:
            time.sleep(0.05)
            continue
        if statuses[-1] == 200:
            break
        time.sleep(0.05)
    assert statuses and statuses[-1] == 200, d.log()
    assert set(statuses) <= {200, 503}
    assert d.get("/readyz").text == "ready\n"
    # Ready means the first poll landed: the replayed numbers are already exported.
    assert sample(d.scrape(), "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000


def test_healthz_is_200_while_polls_are_fresh(start_daemon: StartDaemon) -> None:
    """With a recent poll and a running scheduler /healthz is ok."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    r = d.get("/healthz")
    assert r.status_code == 200
    assert r.text.startswith("ok: ")


def test_scrapes_do_not_trigger_polls(start_daemon: StartDaemon) -> None:
    """20 scrapes with a 1 h poll interval leave the per-poll error count of the raising device at 1."""
    d = start_daemon(*REPLAY, "--poll.interval", "1h")
    # Device 6 raises on every read, so each poll adds exactly 1 to its error counter; the replayed list
    # of device 8 advances one entry per poll, so its value would change too.
    for _ in range(20):
        s = d.scrape()
        assert sample(s, "jaxmon_memory_read_errors_total", device="6", platform="gpu") == 1
        assert sample(s, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000
