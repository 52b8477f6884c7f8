"""A stand-in for libtpu, for tests only: put `tests/sdk_standin` on a child's PYTHONPATH (see tpumonitoring)."""

__version__ = "0.0.0+standin"
