"""Spool files for the tests: the fixture document a publisher writes, and writing one with a chosen mtime."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.helpers import FIXTURES

GOOD = json.loads((FIXTURES / "spool_document.json").read_text())


def doc(workload: str, **overrides: Any) -> dict[str, Any]:
    """The fixture document for `workload`, written now unless `time` is given."""
    return {**GOOD, "workload": workload, "time": time.time(), "started": time.time(), **overrides}


def write(path: Path, payload: dict[str, Any] | str, mtime: float | None = None) -> None:
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
