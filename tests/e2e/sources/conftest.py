"""Shared fixtures of the source tests: an opened NVML over each module's own `scenario` (the fake libnvidia-ml.so.1
loaded through its environment)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jaxmon.sources.nvml import Nvml
from tests.fakenvml import Scenario


@pytest.fixture
def nvml(scenario: Scenario) -> Iterator[Nvml]:
    opened = Nvml(xid_wait_seconds=0.05)
    opened.open()
    yield opened
    opened.close()
