"""A stand-in for libtpu's monitoring SDK (`libtpu.sdk.tpumonitoring`), driven by a scenario file the test rewrites.

The same functions and data formats as the real SDK: `list_supported_metrics()` returns the metric names (a list of
str), `get_metric(name)` returns an object whose `.data()` is a list of strings, one per chip or core (tensorcore_util:
one percentage per TensorCore, "12.5"; hlo_queue_size: "tensorcore-0: 1"), and an unknown name raises. On a real
v5e (libtpu 0.0.42.1) every metric's data() was [] where no metrics service could be reached.

The scenario (JSON, path in $JAXMON_TEST_SDK_SCENARIO), read afresh at import and at each call:
- "metrics": {name: [str, ...]}: what data() returns (names not there return []);
- "supported": [name, ...] (default: the 18 names the real libtpu 0.0.42.1 lists);
- "on_import" / "on_data": "ok" (default), "raise" (RuntimeError), "exit" (os._exit(3)), "segfault" (a NULL
  read through ctypes: the process dies of SIGSEGV), "hang" (sleeps "hang_seconds", default 3600);
- "stdout": a string the SDK prints to file descriptor 1 on each data() call (a chatty C++ library).
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from typing import Any

SUPPORTED = [
    "tensorcore_util", "duty_cycle_pct", "hbm_capacity_total", "hbm_capacity_usage", "ici_link_health",
    "tpu_throttle_score", "hlo_execution_timing", "hlo_queue_size", "collective_e2e_latency",
    "buffer_transfer_latency", "inbound_buffer_transfer_latency", "host_to_device_transfer_latency",
    "device_to_host_transfer_latency", "host_compute_latency", "runtime_hbm_utilization", "idle_duration",
    "tcp_min_rtt", "tcp_delivery_rate",
]  # fmt: skip


def _scenario() -> dict[str, Any]:
    path = os.environ.get("JAXMON_TEST_SDK_SCENARIO")
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        return dict(json.load(f))


def _act(what: str, scenario: dict[str, Any]) -> None:
    if what == "raise":
        raise RuntimeError("the stand-in SDK was told to raise")
    if what == "exit":
        os._exit(3)
    if what == "segfault":
        ctypes.string_at(0)
    if what == "hang":
        time.sleep(float(scenario.get("hang_seconds", 3600)))


_act(_scenario().get("on_import", "ok"), _scenario())


class Metric:
    """What get_metric returns: the metric's name, its description, and data()."""

    def __init__(self, name: str) -> None:
        self.name = name

    def description(self) -> str:
        return f"stand-in {self.name}"

    def data(self) -> list[str]:
        scenario = _scenario()
        _act(scenario.get("on_data", "ok"), scenario)
        if scenario.get("stdout"):
            os.write(1, str(scenario["stdout"]).encode())
        return [str(v) for v in scenario.get("metrics", {}).get(self.name, [])]


def list_supported_metrics() -> list[str]:
    return list(_scenario().get("supported", SUPPORTED))


def get_metric(metric_name: str) -> Metric:
    if metric_name not in list_supported_metrics():
        raise ValueError(f"Metric {metric_name} is not supported")
    return Metric(metric_name)
