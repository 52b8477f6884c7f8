"""Who reads /metrics: a Prometheus scraper, whose scrapes free new series (jaxmon.births) and read an embedded
exporter's last word (jaxmon.lastword), or any other reader (`jaxmon top`, curl, a browser), whose never do.

A scrape identifies as Prometheus by its User-Agent (`Prometheus/<version>`) or by the
`X-Prometheus-Scrape-Timeout-Seconds` header, which Prometheus and the scrapers built on its scrape code (Grafana
Agent and Alloy, the OpenTelemetry Collector's prometheus receiver, vmagent, Google Managed Prometheus' collectors)
send with every scrape. One scraper is a (client address, User-Agent, timeout) triple: the two servers of an HA pair
scrape from their own hosts; two on one host with the same settings read as one scraper that scrapes twice an
interval (jaxmon.lastword counts them so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

TIMEOUT_HEADER = "x-prometheus-scrape-timeout-seconds"


@dataclass(frozen=True)
class Scraper:
    """The reader of one request."""

    prometheus: bool
    key: tuple[str, str, str] = ("", "", "")  # (client address, User-Agent, timeout header)


OTHER = Scraper(prometheus=False)


def deadline(timeout: str, now: float | None = None) -> float | None:
    """When a scraper that sent X-Prometheus-Scrape-Timeout-Seconds `timeout` gives up on a request made now
    (monotonic), None where it said none (or nothing a number)."""
    try:
        seconds = float(timeout)
    except ValueError:
        return None
    return (time.monotonic() if now is None else now) + seconds if seconds > 0 else None


def identify(client: str, user_agent: str, timeout: str) -> Scraper:
    """The scraper of a request from `client` with these User-Agent and X-Prometheus-Scrape-Timeout-Seconds."""
    prometheus = user_agent.startswith("Prometheus/") or timeout != ""
    return Scraper(prometheus, (client, user_agent, timeout)) if prometheus else OTHER


@dataclass
class MetricsRequest:
    """One /metrics request through the exposition: what its render read (a births ticket, whether it rendered the
    last word), reported by the web app once its response was handed to the connection whole (`served`)."""

    scraper: Scraper = OTHER
    ticket: int | None = None  # jaxmon.births.Scrapes ticket, Prometheus scrapes only
    final: bool = False  # it rendered the embedded exporter's last word
    filtered: bool = False  # collect[]: some collectors only, the last word not among them
    # When its scraper gives up on it (monotonic; its timeout header): a response handed over later was not stored.
    deadline: float | None = field(default=None)

    def in_time(self) -> bool:
        """Whether it was handed over before its scraper gave up on it."""
        return self.deadline is None or time.monotonic() <= self.deadline
