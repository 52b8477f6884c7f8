"""jaxmon.lastword: the embedded exporter's word on how its process ends, served to every Prometheus that scrapes it,
and the bounded wait for the scrapes that read it (its waits of a second or more for scrapers in real time are
tests/integration/test_lastword_waits.py's)."""

from __future__ import annotations

import threading
import time

from jaxmon.exposition import Exposition
from jaxmon.lastword import EXCEPTION, MAX_WAIT, NORMAL, SIGNAL, LastWord
from jaxmon.scrapers import MetricsRequest, Scraper, identify
from jaxmon.snapshot import Snapshot
from tests.conftest import parse_samples, sample

A = identify("10.0.0.1", "Prometheus/2.42.0", "10")
B = identify("10.0.0.2", "Prometheus/2.42.0", "10")  # the other server of an HA pair
TOP = identify("10.0.0.3", "jaxmon/0.1.0 (jaxmon top)", "")


def _scrape(word: LastWord, scraper: Scraper) -> MetricsRequest:
    """A scrape of `scraper` that rendered the word as it is now and was served."""
    scrape = MetricsRequest(scraper)
    _, scrape.final = word.families()
    word.served(scrape)
    return scrape


def _said(word: LastWord) -> dict[str, float]:
    families, _ = word.families()
    return {f"{s.name}{sorted(s.labels.items())}": s.value for f in families for s in f.samples}


def test_it_says_nothing_while_running_then_how_the_process_ends() -> None:
    word = LastWord()
    assert _said(word) == {"jaxmon_exporter_stopping[]": 0.0}
    assert word.stop() is True  # no scraper to wait for: at once
    assert _said(word) == {
        "jaxmon_exporter_stopping[]": 1.0,
        "jaxmon_exporter_exit_info[('reason', 'normal'), ('signal', '')]": 1.0,
    }
    crashed = LastWord()
    crashed.say(EXCEPTION)
    assert crashed.say(NORMAL) is False  # the first word stands
    assert _said(crashed) == {
        "jaxmon_exporter_stopping[]": 0.0,  # a crash is not a stop on purpose
        "jaxmon_exporter_exit_info[('reason', 'exception'), ('signal', '')]": 1.0,
    }
    signalled = LastWord()
    signalled.say(SIGNAL, "SIGTERM")
    assert _said(signalled)["jaxmon_exporter_exit_info[('reason', 'signal'), ('signal', 'SIGTERM')]"] == 1.0


def test_a_scraper_seen_once_or_gone_is_not_waited_for() -> None:
    word = LastWord()
    _scrape(word, A)
    assert word.wait_for() == 0.0  # its interval unknown
    started = time.monotonic()
    assert word.stop() is True
    assert time.monotonic() - started < 0.5


def test_a_scrape_in_flight_when_the_word_is_said_does_not_count() -> None:
    word = LastWord()
    _scrape(word, A)
    time.sleep(0.2)
    _scrape(word, A)
    in_flight = MetricsRequest(A)
    _, in_flight.final = word.families()  # rendered before the word ...
    threading.Timer(0.05, word.served, (in_flight,)).start()  # ... and served after it was said
    threading.Timer(0.3, _scrape, (word, A)).start()  # the next scrape reads it
    started = time.monotonic()
    assert word.stop() is True
    assert time.monotonic() - started > 0.25
    assert in_flight.final is False


def test_the_wait_is_bounded() -> None:
    word = LastWord()
    _scrape(word, A)
    time.sleep(0.01)
    _scrape(word, A)
    word._times[A.key][0] -= 3600  # an hour between the two scrapes
    assert word.wait_for() == MAX_WAIT
    started = time.monotonic()
    assert word.stop(most=0.2) is False
    assert time.monotonic() - started < 0.5


def test_the_exposition_serves_it_at_each_scrape_and_counts_only_whole_ones() -> None:
    word = LastWord()
    exposition = Exposition(lambda: Snapshot(), [], None, word)
    scrape = MetricsRequest(A)
    assert sample(parse_samples(exposition.render(False, scrape=scrape).decode()), "jaxmon_exporter_stopping") == 0
    exposition.served(scrape)
    assert scrape.final is False and list(word._times) == [A.key]
    word.say(SIGNAL, "SIGTERM")
    scrape = MetricsRequest(A)
    text = exposition.render(False, scrape=scrape).decode()
    assert sample(parse_samples(text), "jaxmon_exporter_exit_info", reason="signal", signal="SIGTERM") == 1
    assert scrape.final is True
    exposition.served(scrape)
    assert word._finals == {A.key: 1}
    # A filtered scrape (collect[]) is not Prometheus' scrape of the target: the word is not in it, and it counts
    # for nothing here.
    filtered = MetricsRequest(A)
    assert b"jaxmon_exporter" not in exposition.render(False, set(), scrape=filtered)
    exposition.served(filtered)
    assert word._finals == {A.key: 1} and len(word._times[A.key]) == 2
    plain = Exposition(lambda: Snapshot(), [], None)
    assert b"jaxmon_exporter_stopping" not in plain.render(False)


def test_a_scrape_handed_over_after_its_scraper_gave_up_counts_for_nothing() -> None:
    """Past its X-Prometheus-Scrape-Timeout-Seconds Prometheus has stored nothing of a scrape: it neither frees a
    series nor counts as the word read, however whole it was sent."""
    from jaxmon.births import SCRAPES
    from jaxmon.scrapers import deadline

    word = LastWord()
    word.say(NORMAL)
    exposition = Exposition(lambda: Snapshot(), [], None, word)
    late = MetricsRequest(A, deadline=deadline("0.5", now=time.monotonic() - 1.0))
    exposition.render(False, scrape=late)
    assert late.final and late.ticket is not None and not late.in_time()
    exposition.served(late)
    assert word._finals == {} and SCRAPES.proof() < late.ticket
    assert deadline("") is None and deadline("x") is None and deadline("0") is None
