"""The training tests' fixtures of tests/unit/training/conftest.py: one LocalSource for a file, one JaxTraining for
the session, trackers made the current one and stopped after the test."""

from __future__ import annotations

from tests.unit.training.conftest import make_tracker, shared_ops, source

__all__ = ["make_tracker", "shared_ops", "source"]
