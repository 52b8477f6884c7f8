"""jaxmon.lastword: the embedded exporter's stopping gauge and its wait for the scrape that reads it."""

from __future__ import annotations

import threading
import time

from jaxmon.exposition import Exposition
from jaxmon.lastword import MAX_WAIT, LastWord
from jaxmon.snapshot import Snapshot


def _value(word: LastWord) -> float:
    (sample,) = word.family().samples
    return float(sample.value)


def test_no_scraper_no_wait() -> None:
    word = LastWord()
    assert _value(word) == 0.0
    started = time.monotonic()
    assert word.stop() is False
    assert time.monotonic() - started < 0.5
    assert _value(word) == 1.0


def test_one_scrape_is_not_a_scraper() -> None:
    word = LastWord()
    word.scraped()
    assert word.wait_for() == 0.0
    assert word.stop() is False


def test_stop_waits_for_the_next_scrape_and_it_says_stopping() -> None:
    word = LastWord()
    word.scraped()
    time.sleep(0.2)
    word.scraped()
    wait = word.wait_for()
    assert 1.2 <= wait <= 1.0 + 1.5 * 0.2 + 0.2  # 1.5 x the interval + 1 s
    seen: list[float] = []

    def scraper() -> None:
        time.sleep(0.1)
        seen.append(_value(word))
        word.scraped()

    thread = threading.Thread(target=scraper)
    thread.start()
    assert word.stop() is True
    thread.join()
    assert seen == [1.0]


def test_a_missed_scrape_gives_up_after_the_wait() -> None:
    word = LastWord()
    word.scraped()
    time.sleep(0.05)
    word.scraped()
    started = time.monotonic()
    assert word.stop() is False
    took = time.monotonic() - started
    assert 1.0 <= took < 3.0


def test_the_wait_is_bounded() -> None:
    word = LastWord()
    word.scraped()
    word.scraped()
    word._times[0] -= 3600  # an hour between the two scrapes
    assert word.wait_for() == MAX_WAIT
    assert word.stop(most=0.0) is False


def test_the_exposition_serves_it_at_each_scrape_and_counts_scrapes() -> None:
    word = LastWord()
    exposition = Exposition(lambda: Snapshot(), [], None, word)
    assert b"jaxmon_exporter_stopping 0.0" in exposition.render(False)
    word.stopping = True
    assert b"jaxmon_exporter_stopping 1.0" in exposition.render(False)
    assert word.scrapes == 2
    # A filtered scrape (collect[]) is not Prometheus' scrape of the target: not counted, not served.
    assert b"jaxmon_exporter_stopping" not in exposition.render(False, set())
    assert word.scrapes == 2
    plain = Exposition(lambda: Snapshot(), [], None)
    assert b"jaxmon_exporter_stopping" not in plain.render(False)
