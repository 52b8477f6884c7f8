"""The stand-in's `libtpu.sdk`: as the real one, it holds `tpumonitoring`."""

from libtpu.sdk import tpumonitoring

__all__ = ["tpumonitoring"]
