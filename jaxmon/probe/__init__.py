"""The utilization probe: the timing engine (`engine`), its persisted baselines (`baseline`) and its idle gate
(`idle`). The probe collector (`jaxmon.collectors.probe`) schedules it and renders its status."""

from jaxmon.probe.engine import WARMUP_STEPS, DeviceProbe, ProbeConfig, longest_pauses

__all__ = ["WARMUP_STEPS", "DeviceProbe", "ProbeConfig", "longest_pauses"]
