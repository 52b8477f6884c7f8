"""The integration lane: tests of the unit suite's kind, in this process on the 8 CPU devices, that run for seconds
each (training loops of thousands of steps, timing scenarios of many looks, validation against schema sets).
`bash tests/run.sh` runs them with the rest (pyproject.toml's testpaths); the inner loop (`bash tests/run.sh --unit`)
and tests/floors.sh run tests/unit only. They start no process and open no inet socket either: tests/unit/conftest.py's
guard and its `local` fixture hold here too."""

from __future__ import annotations

from tests.unit.conftest import local, pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown

__all__ = ["local", "pytest_runtest_call", "pytest_runtest_setup", "pytest_runtest_teardown"]
