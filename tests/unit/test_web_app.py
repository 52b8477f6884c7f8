"""The ASGI app in-process over a replay runtime: routing, methods, HEAD, gzip, collect[], readiness, 503 when full.

The app is driven through the ASGI protocol itself (scope, receive, send), the way hypercorn calls it; the daemon
over real HTTP is tested in tests/e2e/test_http.py and the tests/e2e/test_daemon_*.py files.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector
from structlog.testing import capture_logs

from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.default_registry import DefaultRegistryCollector, DefaultRegistryOptions
from jaxmon.compose import build_runtime, load_settings
from jaxmon.runtime import Runtime
from jaxmon.sources.replay import ReplaySource
from jaxmon.web.asgi import App
from jaxmon.web.reload import WebState
from tests.conftest import FIXTURES, ROOT, parse_samples, sample, wait_until

REPLAY = ["--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1h", "--devices.include-cpu"]  # all 9
Message = MutableMapping[str, Any]


@dataclass
class Reply:
    """What the app sent for one request."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


def scope(method: str, path: str, query: bytes = b"", headers: dict[str, str] | None = None) -> Message:
    """An HTTP scope as hypercorn builds it (header names lower-case bytes)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 10401),
    }


async def receive_nothing() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def call(
    app: App,
    method: str,
    path: str,
    query: bytes = b"",
    headers: dict[str, str] | None = None,
    on_send: Callable[[Message], Awaitable[None]] | None = None,
) -> Reply:
    """One request through the ASGI interface; checks the message sequence a server expects."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if on_send is not None:
            await on_send(message)

    await app(scope(method, path, query, headers), receive_nothing, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"], sent
    start, body = sent
    names = [k for k, _ in start["headers"]]
    assert len(names) == len(set(names)), f"repeated headers: {names}"
    decoded = {k.decode(): v.decode() for k, v in start["headers"]}
    return Reply(start["status"], decoded, body["body"])


def request(app: App, method: str, path: str, query: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
    """`call` on a fresh event loop."""
    return asyncio.run(call(app, method, path, query, headers))


def make_runtime(*args: str) -> Runtime:
    """The runtime `jaxmon serve --replay shapes.json ARGS` builds, not started (no scheduler, no threads)."""
    return build_runtime(load_settings([*REPLAY, *args]))


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    """The replay runtime after one update of every collector."""
    rt = make_runtime()
    rt.update_all_once()
    yield rt
    rt.stop()


def make_app(rt: Runtime, telemetry_path: str = "/metrics", max_requests: int = 40) -> App:
    return App(rt, telemetry_path, WebState(None), max_requests)


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


def jaxmon_lines(body: bytes) -> list[bytes]:
    """The lines of jaxmon's own families (process_* and python_* are read anew on every scrape)."""
    return [line for line in body.splitlines() if b"jaxmon_" in line]


# -- routing --------------------------------------------------------------------------------------------------


def test_an_unknown_path_is_404_for_every_method(runtime: Runtime) -> None:
    """Paths outside the four routes are not found, for GET and for other methods alike."""
    app = make_app(runtime)
    for method in ("GET", "HEAD", "POST", "DELETE"):
        reply = request(app, method, "/nope")
        assert reply.status == 404, method
    assert request(app, "GET", "/nope").text == "not found\n"
    assert request(app, "GET", "/metrics/").status == 404  # no prefix matching


def test_other_methods_on_a_known_path_are_405_with_an_allow_header(runtime: Runtime) -> None:
    """Only GET and HEAD are allowed on the four routes, and the 405 says which."""
    app = make_app(runtime)
    for path in ("/metrics", "/healthz", "/readyz", "/"):
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            reply = request(app, method, path)
            assert (reply.status, reply.headers.get("allow")) == (405, "GET, HEAD"), (method, path)


def test_head_is_get_without_the_body(runtime: Runtime) -> None:
    """HEAD answers like GET: same status, type and Content-Length, empty body."""
    app = make_app(runtime)
    # collect[] leaves out the process_* families, which are read anew per scrape and change length.
    query = b"collect[]=memory"
    get = request(app, "GET", "/metrics", query, {"accept-encoding": "identity"})
    head = request(app, "HEAD", "/metrics", query, {"accept-encoding": "identity"})
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-type"] == get.headers["content-type"]
    assert int(head.headers["content-length"]) == len(get.body) > 0
    for path in ("/healthz", "/readyz", "/"):
        assert request(app, "HEAD", path).body == b"", path


def test_the_landing_page_is_html_linking_metrics_healthz_and_readyz(runtime: Runtime) -> None:
    """GET / is an HTML page whose links are the telemetry path and the two health endpoints."""
    reply = request(make_app(runtime), "GET", "/")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert {"/metrics", "/healthz", "/readyz"} <= set(links_of(reply.text))
    assert "9 devices from source <code>replay</code>" in reply.text  # shapes.json replays 9 devices


def test_the_landing_page_shows_the_version_health_collectors_and_devices(tmp_path: Path) -> None:
    """What a person opening / wants to know: which jaxmon, healthy or not, which collectors run and how, which
    devices (one device is "1 device", not "1 devices")."""
    fresh = make_runtime()
    try:
        app = make_app(fresh)
        before = request(app, "GET", "/").text
        fresh.update_all_once()
        page = request(app, "GET", "/").text
    finally:
        fresh.stop()
    assert "<code>memory</code>: no update yet" in before and "(first poll done): not ready" in before
    assert f"<h1>jaxmon {fresh.snapshot().build['version']}</h1>" in page
    assert "<code>memory</code>: <strong>failing</strong>" in page  # shapes.json's gpu:6 fails on purpose
    assert "(first poll done): ready" in page
    for device in ("gpu:0", "tpu:3", "cpu:5", "gpu:8"):
        assert f"<li><code>{device}</code>" in page
    replay = tmp_path / "one.json"
    replay.write_text(json.dumps({"devices": [{"id": 0, "platform": "gpu", "memory_stats": {"bytes_in_use": 1}}]}))
    one = make_runtime("--replay", str(replay))
    try:
        one.update_all_once()
        single = request(make_app(one), "GET", "/").text
    finally:
        one.stop()
    assert "1 device from source" in single and "<code>memory</code>: ok" in single


def test_a_custom_telemetry_path_serves_metrics_there_and_not_at_metrics() -> None:
    """--web.telemetry-path moves the exposition; /metrics is then unknown and the landing page links the new path."""
    rt = make_runtime("--web.telemetry-path", "/custom")
    try:
        rt.update_all_once()
        app = make_app(rt, telemetry_path="/custom")
        reply = request(app, "GET", "/custom")
        assert reply.status == 200
        assert sample(parse_samples(reply.text), "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000
        assert request(app, "GET", "/metrics").status == 404
        links = set(links_of(request(app, "GET", "/").text))
        assert "/custom" in links and "/metrics" not in links
    finally:
        rt.stop()


# -- the exposition -------------------------------------------------------------------------------------------


def test_metrics_are_the_text_format_with_the_replayed_values(runtime: Runtime) -> None:
    """200, the 0.0.4 text content type, no caching, and the numbers shapes.json holds."""
    reply = request(make_app(runtime), "GET", "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert reply.headers["cache-control"] == "no-store"
    assert "content-encoding" not in reply.headers
    samples = parse_samples(reply.text)
    assert sample(samples, "jaxmon_memory_bytes_in_use", device="0", platform="gpu") == 20 * 2**30
    assert sample(samples, "process_resident_memory_bytes") is not None


@pytest.mark.parametrize(
    ("accept", "gzipped"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("deflate;q=1.0, GZIP;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("*, gzip;q=0", False),
        ("identity", False),
        ("", False),
    ],
)
def test_metrics_are_gzipped_exactly_when_the_client_accepts_gzip(runtime: Runtime, accept: str, gzipped: bool) -> None:
    """Accept-Encoding decides: a gzip body (that decompresses to the plain exposition) with Vary, or plain text."""
    app = make_app(runtime)
    plain = request(app, "GET", "/metrics", headers={"accept-encoding": "identity"})
    reply = request(app, "GET", "/metrics", headers={"accept-encoding": accept} if accept else {})
    assert reply.status == 200
    if gzipped:
        assert reply.headers["content-encoding"] == "gzip"
        assert reply.headers["vary"] == "accept-encoding"
        assert reply.body[:2] == b"\x1f\x8b"  # the gzip magic number
        body = gzip.decompress(reply.body)
        assert jaxmon_lines(body) == jaxmon_lines(plain.body)
        assert b"\nprocess_resident_memory_bytes " in body  # the second gzip member
        assert len(reply.body) < len(plain.body)
    else:
        assert "content-encoding" not in reply.headers
        assert jaxmon_lines(reply.body) == jaxmon_lines(plain.body)
    assert int(reply.headers["content-length"]) == len(reply.body)


def test_collect_selects_collectors_and_an_unknown_one_is_400_naming_it(runtime: Runtime) -> None:
    """collect[]=memory: its families and collector_* series only; unknown names: 400 naming them and the running."""
    app = make_app(runtime)
    memory = parse_samples(request(app, "GET", "/metrics", b"collect%5B%5D=memory").text)
    assert sample(memory, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000
    assert sample(memory, "jaxmon_collector_success", collector="memory") == 0  # device 6 raises
    # No last-success timestamp: the memory collector has not succeeded yet (an absent series, not 0).
    assert {name for name, _ in memory if not name.startswith("jaxmon_memory_")} == {
        "jaxmon_collector_success",
        "jaxmon_collector_duration_seconds",
    }
    unknown = request(app, "GET", "/metrics", b"collect[]=memory&collect[]=nope&collect[]=gpu")
    assert unknown.status == 400
    assert unknown.text == "collect[]: no running collector gpu, nope (running: memory)\n"


def test_scrapes_do_not_run_collectors(runtime: Runtime) -> None:
    """20 scrapes after one update: the raising device's error count stays 1 and device 8's replayed list unmoved."""
    app = make_app(runtime)
    for _ in range(20):
        s = parse_samples(request(app, "GET", "/metrics").text)
        assert sample(s, "jaxmon_memory_read_errors_total", device="6", platform="gpu") == 1
        assert sample(s, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000


# -- health and readiness -------------------------------------------------------------------------------------


def test_readyz_is_503_until_the_first_update_and_200_after() -> None:
    """Ready means the first update landed: before it 503, after it 200 and the replayed numbers are exported."""
    rt = make_runtime()
    try:
        app = make_app(rt)
        before = request(app, "GET", "/readyz")
        assert (before.status, before.text) == (503, "not ready: first poll not complete\n")
        rt.update_all_once()
        after = request(app, "GET", "/readyz")
        assert (after.status, after.text) == (200, "ready\n")
        s = parse_samples(request(app, "GET", "/metrics").text)
        assert sample(s, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000
    finally:
        rt.stop()


def test_healthz_follows_the_scheduler_and_the_first_update() -> None:
    """503 while the scheduler is not running, 200 once it runs and the first update completed, 503 after stop."""
    rt = make_runtime()
    app = make_app(rt)
    try:
        stopped = request(app, "GET", "/healthz")
        assert (stopped.status, stopped.text) == (503, "unhealthy: scheduler is not running\n")
        rt.start()  # the first update runs at once, the next in an hour
        wait_until(lambda: rt.ready, what="the first update")
        healthy = request(app, "GET", "/healthz")
        assert healthy.status == 200
        assert healthy.text.startswith("ok: last update: memory ")
    finally:
        rt.stop()
    assert request(app, "GET", "/healthz").status == 503


# -- bounds ---------------------------------------------------------------------------------------------------


def test_requests_past_max_requests_are_503_and_the_slot_is_freed_after() -> None:
    """--web.max-requests 1 with a response still being sent: the next request is 503; then served again."""
    rt = make_runtime()
    rt.update_all_once()
    app = make_app(rt, max_requests=1)

    async def scenario() -> tuple[Reply, Reply, Reply]:
        release = asyncio.Event()
        started = asyncio.Event()

        async def hold(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.set()
                await release.wait()  # a slow client: the response is still in flight

        first = asyncio.create_task(call(app, "GET", "/metrics", on_send=hold))
        await started.wait()
        second = await call(app, "GET", "/metrics")
        release.set()
        done = await first
        third = await call(app, "GET", "/readyz")
        return done, second, third

    try:
        first, second, third = asyncio.run(scenario())
    finally:
        rt.stop()
    assert first.status == 200 and b"jaxmon_memory_bytes_in_use" in first.body
    assert (second.status, second.text) == (503, "too many requests in flight\n")
    assert third.status == 200


def test_lifespan_startup_and_shutdown_are_acknowledged(runtime: Runtime) -> None:
    """hypercorn sends lifespan events first; the app completes both and returns."""
    app = make_app(runtime)
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


# -- collectors on and off ------------------------------------------------------------------------------------


def test_no_collector_memory_removes_the_memory_families() -> None:
    """--no-collector.memory: no jaxmon_memory_* family and no memory collector series; identity stays."""
    rt = make_runtime("--no-collector.memory")
    try:
        rt.update_all_once()
        text = request(make_app(rt), "GET", "/metrics").text
    finally:
        rt.stop()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert not [f for f in families if f.startswith("jaxmon_memory_")]
    assert "jaxmon_device_info" in families  # identity is the source's, not the memory collector's
    assert 'collector="memory"' not in text


def test_an_explicit_collector_that_cannot_run_is_reported_failed_and_logged() -> None:
    """--collector.spool without a directory: collector_success 0 and an error log line; auto is silently off."""
    with capture_logs() as logs:
        rt = make_runtime("--collector.spool")
    try:
        s = parse_samples(request(make_app(rt), "GET", "/metrics").text)
    finally:
        rt.stop()
    assert sample(s, "jaxmon_collector_success", collector="spool") == 0.0
    (line,) = [e for e in logs if e["event"] == "collector cannot run"]
    assert line["collector"] == "spool" and "no --collector.spool.dir given" in line["reason"]
    quiet = make_runtime()
    try:
        assert (
            sample(
                parse_samples(request(make_app(quiet), "GET", "/metrics").text),
                "jaxmon_collector_success",
                collector="spool",
            )
            is None
        )
    finally:
        quiet.stop()


def test_an_auto_collector_configured_but_off_is_named_with_the_reason() -> None:
    """--collector.kubernetes.socket where no kubelet listens: kubernetes stays off (auto), and the collectors log
    line says it is configured, why it is off and how to run it anyway. (--collector.tpu.address turns tpu on.)"""
    with capture_logs() as logs:
        rt = make_runtime("--collector.kubernetes.socket", "/nonexistent/kubelet.sock")
    rt.stop()
    (line,) = [e for e in logs if e["event"] == "collectors"]
    assert "kubernetes" not in line["running"]
    off = line["configured_but_off"]["kubernetes"]
    assert "no kubelet pod-resources socket" in off and "collector.kubernetes.socket set" in off
    assert "--collector.kubernetes" in off
    with capture_logs() as logs:
        make_runtime().stop()
    assert next(e for e in logs if e["event"] == "collectors")["configured_but_off"] is None


def test_the_replay_demo_looks_healthy() -> None:
    """The README's demo (deploy/demo/replay.json): every collector succeeds; tests/fixtures/shapes.json is the
    suite's hard case, with a device that fails on purpose."""
    demo = build_runtime(load_settings(["--replay", str(ROOT / "deploy" / "demo" / "replay.json")]))
    try:
        demo.update_all_once()
        s = parse_samples(request(make_app(demo), "GET", "/metrics").text)
    finally:
        demo.stop()
    statuses = {dict(k[1])["collector"]: v for k, v in s.items() if k[0] == "jaxmon_collector_success"}
    assert statuses == {"memory": 1.0}


# -- the user's own collectors (prometheus_client's default registry, embedded) ------------------------------


class Stuck(PromCollector):
    """A user's collector whose collect() blocks until the test releases it (at most 20 s: never forever)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        self.entered.set()
        self.release.wait(20)
        yield GaugeMetricFamily("stuck_value", "The stuck collector's own.", value=1)


class Raising(PromCollector):
    def collect(self) -> Iterator[Metric]:
        raise RuntimeError("the user's collector is broken")


@contextmanager
def embedded_runtime(registry: CollectorRegistry, timeout: float) -> Iterator[Runtime]:
    """The replay runtime with a default_registry collector over `registry` (as in a workload process), started:
    the first update at once, the next in an hour."""
    rt = make_runtime()
    ctx = standalone_context(ReplaySource(FIXTURES / "shapes.json"), workload="w")
    registry_collector = DefaultRegistryCollector(DefaultRegistryOptions(timeout=timeout), ctx, registry=registry)
    embedded = Runtime(rt.recorder, [*rt.collectors, registry_collector], rt.max_staleness)
    embedded.start()
    try:
        wait_until(lambda: embedded.ready, what="the first update")
        yield embedded
    finally:
        embedded.stop()


def registry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "jaxmon-default-registry"]


def test_healthz_answers_while_a_scrape_waits_for_a_slow_user_collector() -> None:
    """The scrape waits for the user's collector off the event loop: /healthz is answered (200) while /metrics is
    still waiting, and /metrics then serves the collector's family once it answers within the deadline."""
    registry = CollectorRegistry()
    stuck = Stuck()
    registry.register(stuck)
    with embedded_runtime(registry, timeout=30.0) as rt:
        app = make_app(rt)

        async def scenario() -> tuple[Reply, bool, Reply]:
            scrape = asyncio.create_task(call(app, "GET", "/metrics"))
            # Before the old tree's render got here, it blocked this loop: the wait below never ended in time.
            await asyncio.wait_for(asyncio.to_thread(stuck.entered.wait, 30), 40)
            health = await asyncio.wait_for(call(app, "GET", "/healthz"), 30)
            waiting = not scrape.done()
            stuck.release.set()
            return health, waiting, await asyncio.wait_for(scrape, 30)

        health, waiting, metrics = asyncio.run(scenario())
    assert health.status == 200 and waiting
    s = parse_samples(metrics.text)
    assert sample(s, "stuck_value") == 1 and sample(s, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000


def test_a_hung_or_raising_user_collector_leaves_jaxmons_families_and_the_others_served_once_per_hang() -> None:
    """A collector that does not answer within the deadline, and one that raises: /metrics answers with jaxmon's
    families and the registry's other families, without theirs; default_registry's success says so, a log line names
    each; later scrapes call the hung collect() no second time (one thread held) and keep serving the rest."""
    registry = CollectorRegistry()
    stuck = Stuck()
    registry.register(stuck)
    registry.register(Raising())
    Gauge("trainer_fine", "A collector that answers.", registry=registry).set(3)
    try:
        # The first update waits out the deadline on the stuck collector: 1 s, hundreds of times what the other two
        # take on a loaded machine.
        with capture_logs() as logs, embedded_runtime(registry, timeout=1.0) as rt:
            app = make_app(rt)
            replies = [asyncio.run(asyncio.wait_for(call(app, "GET", "/metrics"), 30)) for _ in range(4)]
            rt.update_all_once()
            after = parse_samples(request(app, "GET", "/metrics").text)
            healthz = request(app, "GET", "/healthz")
            calls = stuck.calls
            # One thread is left in the hung collect(); the readings after it end (wait: the last may be exiting).
            wait_until(lambda: len(registry_threads()) == 1, what="one registry thread, in the hung collect()")
    finally:
        stuck.release.set()
    for reply in replies:
        s = parse_samples(reply.text)
        assert reply.status == 200
        assert sample(s, "jaxmon_memory_bytes_in_use", device="8", platform="gpu") == 1000
        assert sample(s, "stuck_value") is None
    # The first scrape's reading was held up at the stuck collector; every later one reads past it.
    assert all(sample(parse_samples(r.text), "trainer_fine") == 3 for r in replies[1:])
    assert calls == 1
    assert sample(after, "jaxmon_collector_success", collector="default_registry") == 0
    assert healthz.status == 200
    events = {(e["event"].split(":")[0], e["collector"]) for e in logs if "default registry" in e["event"]}
    assert ("a collector of prometheus_client's default registry did not answer in time", "Stuck") in events
    assert ("a collector of prometheus_client's default registry failed", "Raising") in events


class WithExemplar(PromCollector):
    """A user's gauge with an exemplar: the text format drops it, OpenMetrics refuses the family."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.samples import Exemplar, Sample

        family = GaugeMetricFamily("trainer_gauge", "A gauge with an exemplar.")
        family.samples.append(Sample("trainer_gauge", {}, 2.0, exemplar=Exemplar({"trace": "1"}, 1.0)))
        yield family


def test_openmetrics_when_asked_and_the_text_format_when_a_family_cannot_be_written_in_it() -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    openmetrics = {"accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"}
    with embedded_runtime(CollectorRegistry(), timeout=3.0) as rt:
        reply = request(make_app(rt), "GET", "/metrics", headers=openmetrics)
    assert reply.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    names = {f.name for f in text_string_to_metric_families(reply.text)}  # type: ignore[no-untyped-call]
    assert "jaxmon_memory_bytes_in_use" in names and reply.text.endswith("# EOF\n")
    registry = CollectorRegistry()
    registry.register(WithExemplar())
    with capture_logs() as logs, embedded_runtime(registry, timeout=3.0) as rt:
        reply = request(make_app(rt), "GET", "/metrics", headers=openmetrics)
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert sample(parse_samples(reply.text), "trainer_gauge") == 2.0
    assert any(e["event"].startswith("OpenMetrics exposition failed") for e in logs)
