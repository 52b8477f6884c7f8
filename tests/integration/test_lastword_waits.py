"""jaxmon.lastword's wait at stop() for the scrapers that have not read the word yet, in real time: scrapers seconds
apart, and a stop() that waits for the next scrape or, for one that never comes, its deadline (a second or more).
The word itself and the other waits are tests/unit/test_lastword.py's."""

from __future__ import annotations

import threading
import time

from jaxmon.lastword import LastWord
from jaxmon.scrapers import Scraper, identify
from tests.unit.test_lastword import TOP, A, B, _scrape


def test_stop_waits_for_each_scraper_of_an_ha_pair_to_read_the_word() -> None:
    word = LastWord()
    for _ in range(2):
        _scrape(word, A)
        _scrape(word, B)
        time.sleep(0.3)
    assert 1.0 < word.wait_for() <= 1.0 + 1.5 * 0.3 + 0.1
    seen: list[tuple[Scraper, bool]] = []

    def scrapers() -> None:
        time.sleep(0.1)
        seen.append((A, _scrape(word, A).final))
        time.sleep(0.1)
        seen.append((B, _scrape(word, B).final))

    thread = threading.Thread(target=scrapers)
    thread.start()
    started = time.monotonic()
    assert word.stop() is True
    took = time.monotonic() - started
    thread.join()
    assert seen == [(A, True), (B, True)]
    assert 0.15 < took < 1.0  # until the second one read it, not until its deadline (1.45 s)


def test_jaxmon_top_and_curl_are_neither_waited_for_nor_readers_of_the_word() -> None:
    word = LastWord()
    for _ in range(3):
        _scrape(word, TOP)
        _scrape(word, identify("10.0.0.4", "curl/8.5.0", ""))
        time.sleep(0.05)
    assert word.wait_for() == 0.0
    _scrape(word, A)
    time.sleep(0.2)
    _scrape(word, A)
    threading.Timer(0.05, _scrape, (word, TOP)).start()  # reads the word, but is not Prometheus
    started = time.monotonic()
    assert word.stop() is False  # A never came back: waited for its next scrape only
    assert 1.0 < time.monotonic() - started < 1.0 + 1.5 * 0.2 + 0.3


def test_two_servers_behind_one_key_are_each_owed_the_word() -> None:
    """Two Prometheus on one host with the same settings, scraping 0.05 s apart: one key that scrapes twice an
    interval. The issue's case: stop() waited 1.08 s (1.5 x 0.05 + 1) and neither read the word."""
    word = LastWord()
    for _ in range(3):
        _scrape(word, A)
        time.sleep(0.05)
        _scrape(word, A)
        time.sleep(0.4)
    ((count, _),) = word.owed(time.monotonic()).values()
    assert count == 2
    threading.Timer(0.05, _scrape, (word, A)).start()
    threading.Timer(0.1, _scrape, (word, A)).start()
    assert word.stop() is True
