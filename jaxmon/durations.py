"""Durations in settings: seconds as a number or a Prometheus-style string (`500ms`, `10s`, `2m`, `1h`).

Its own module so that collector options (imported while `jaxmon.settings` builds its collector sections) can use it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> Any:
    """Accept seconds as a number or a Prometheus-style duration string: `500ms`, `10s`, `2m`, `1h`."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 10s, 2m)")
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
