"""Durations in settings: seconds as a number or a Prometheus-style string (`500ms`, `10s`, `2m`, `1h`).

Bounds are checked here rather than with pydantic's `gt`/`le`, so that a message says what the user wrote in the
units they wrote it in ("must be at most 1s (got 5s)", not "less than or equal to 1").
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

_DURATION = re.compile(r"^\s*([-+]?)\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> Any:
    """Accept seconds as a number or a Prometheus-style duration string: `500ms`, `10s`, `2m`, `1h`."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 10s, 2m)")
        sign = -1.0 if match.group(1) == "-" else 1.0
        return sign * float(match.group(2)) * _UNIT_SECONDS[match.group(3)]
    return value


def format_duration(seconds: float) -> str:
    """Seconds as the duration string a user would write: 15s, 2ms, 5m, 1h, -1s."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s" if seconds >= 1 or seconds == 0 else f"{seconds * 1000:g}ms"


def bounded(low: float | None = 0.0, high: float | None = None) -> AfterValidator:
    """A check that a duration is longer than `low` (exclusive) and at most `high`, in the user's units."""

    def check(seconds: float) -> float:
        if low is not None and not seconds > low:
            raise ValueError(f"must be longer than {format_duration(low)} (got {format_duration(seconds)})")
        if high is not None and seconds > high:
            raise ValueError(f"must be at most {format_duration(high)} (got {format_duration(seconds)})")
        return seconds

    return AfterValidator(check)


# A positive duration. Fields with other bounds write `Annotated[float, BeforeValidator(parse_duration),
# bounded(...)]` (the help keys on parse_duration to show DURATION).
Duration = Annotated[float, BeforeValidator(parse_duration), bounded()]
