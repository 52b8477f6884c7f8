"""The tpu collector without a libtpu service: when `auto` runs it, its flags, and what a poll's reading becomes
(series, labels, logs, success) with a stub in the gRPC client's place.

The collector against a real gRPC libtpu service on loopback (tests/fake_libtpu.py) is
tests/e2e/collectors/test_tpu.py.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from jaxmon.collectors.base import Context, Update, standalone_context
from jaxmon.collectors.tpu import TpuCollector, TpuOptions, TpuState, chip_labels, host_labels
from jaxmon.compose import load_settings
from jaxmon.settings import SettingsError
from jaxmon.snapshot import Snapshot
from jaxmon.sources import libtpu
from jaxmon.sources.local import LocalSource
from jaxmon.sources.local.workload import InProcessWorkload
from jaxmon.text_format import TextFormat
from tests.helpers import parse_samples, sample


@pytest.fixture(scope="module")
def context() -> Context:
    source = LocalSource(environ={})
    devices, _ = source.discover()
    return standalone_context(source, devices)


def test_auto_stays_off_on_a_host_without_tpu_chips(context: Context) -> None:
    # This machine has no Google PCI device and its JAX runs on CPU: `auto` must not poll a service that cannot exist.
    reason = TpuCollector.unavailable(TpuOptions(), context)
    assert reason is not None and "no TPU chip" in reason


def test_an_explicit_collector_runs_on_a_host_without_tpu_chips(context: Context) -> None:
    # The sidecar's container may show no chip; the service is reachable all the same.
    explicit = load_settings(["--collector.tpu"]).collector_options("tpu")
    assert isinstance(explicit, TpuOptions)
    assert TpuCollector.unavailable(explicit, context) is None


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--collector.tpu.address", "10.0.0.7:8431"], {}),
        ([], {"JAXMON_COLLECTOR__TPU__ADDRESS": "10.0.0.7:8431"}),
        (["--collector.tpu.address", "localhost:8431"], {}),  # the default, named: meant all the same
    ],
)
def test_naming_the_address_turns_auto_on_on_a_host_without_tpu_chips(
    context: Context, argv: list[str], environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    opts = load_settings(argv).collector_options("tpu")
    assert isinstance(opts, TpuOptions) and opts.enabled == "auto"
    assert TpuCollector.unavailable(opts, context) is None
    # An explicit false stays off, address or not.
    off = load_settings([*argv, "--no-collector.tpu"]).collector_options("tpu")
    assert off.enabled is False


def test_flags_set_the_address_the_deadline_and_enable_the_collector() -> None:
    settings = load_settings(
        ["--collector.tpu", "--collector.tpu.address", "127.0.0.1:9", "--collector.tpu.timeout", "250ms"]
    )
    opts = settings.collector_options("tpu")
    assert isinstance(opts, TpuOptions)
    assert (opts.enabled, opts.address, opts.timeout) == (True, "127.0.0.1:9", 0.25)
    assert load_settings([]).collector_options("tpu").enabled == "auto"


def test_a_bad_deadline_is_rejected_naming_the_flag() -> None:
    with pytest.raises(SettingsError, match=r"collector\.tpu\.timeout.*not a duration"):
        load_settings(["--collector.tpu.timeout", "soon"])


@pytest.mark.parametrize("address", ["", "localhost", "localhost:99999", "localhost:0", "no such host:8431"])
def test_a_bad_address_is_rejected_naming_the_flag(address: str) -> None:
    with pytest.raises(SettingsError, match=r"collector\.tpu\.address.*host:port"):
        load_settings(["--collector.tpu.address", address])


@pytest.mark.parametrize("address", ["localhost:8431", "127.0.0.1:8431", "[::1]:8431", "unix:/run/libtpu.sock"])
def test_addresses_grpc_takes_are_accepted(address: str) -> None:
    opts = load_settings(["--collector.tpu.address", address]).collector_options("tpu")
    assert isinstance(opts, TpuOptions) and opts.address == address


# --------------------------------------------------------------------------------------------------------------
# What a poll's reading becomes: series, logs and success, with a stub in the gRPC client's place
# --------------------------------------------------------------------------------------------------------------

GIB = 1 << 30
DCN, RTT = libtpu.names.DCN_TRANSFER, libtpu.names.GRPC_TCP_MIN_RTT
QUANTILES = ((0.5, 0.002), (0.9, 0.004), (0.95, 0.005), (0.999, 0.0075))


class StubClient:
    """Answers each poll with the next reading (or raises it), as LibtpuClient.poll would."""

    def __init__(self, *readings: libtpu.LibtpuReading | Exception) -> None:
        self.readings = list(readings)

    def poll(self) -> libtpu.LibtpuReading:
        r = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        if isinstance(r, Exception):
            raise r
        return r

    def close(self) -> None:
        pass


def reading(**kw: Any) -> libtpu.LibtpuReading:
    """Chips 8 and 9 with every gauge; the host's DCN transfers of two sizes and its gRPC RTT."""
    gauges = {
        libtpu.TOTAL: {8: 16.0 * GIB, 9: 16.0 * GIB},
        libtpu.USAGE: {8: 3.0 * GIB, 9: 5.0 * GIB},
        libtpu.DUTY_CYCLE: {8: 40.0, 9: 60.0},
        libtpu.IDLE_DURATION: {8: 0.25, 9: 12.5},
    }
    host = {
        DCN: (
            libtpu.Summary("4MB+", 100, 0.15, QUANTILES),
            libtpu.Summary("8MB+", 200, 0.8, ((0.5, 0.0062), (0.9, 0.0133))),
        ),
        RTT: (libtpu.Summary(None, 8, 0.000012, ((0.5, 20e-6),)),),
    }
    return libtpu.LibtpuReading(gauges=kw.pop("gauges", gauges), host=kw.pop("host", host), **kw)


def with_stub(context: Context, stub: StubClient) -> TpuCollector:
    # The SDK's child is a process: tests/e2e/test_tpu_sdk.py runs it.
    collector = TpuCollector(TpuOptions(enabled=True, sdk=False), context)
    collector._client = cast(libtpu.LibtpuClient, stub)
    return collector


def exposition(collector: TpuCollector, update: Update[TpuState]) -> str:
    return TextFormat().render(f for f in collector.families(Snapshot(), update.state) if f.samples).decode()


def test_the_idle_duration_and_the_megascale_summaries_are_rendered_with_their_labels(context: Context) -> None:
    collector = with_stub(context, StubClient(reading()))
    update = collector.update()
    assert update.success
    text = exposition(collector, update)
    s = parse_samples(text)
    for dev, idle in ((8, 0.25), (9, 12.5)):
        assert sample(s, "jaxmon_device_tensorcore_idle_duration_seconds", **chip_labels(dev)) == idle
    name = "jaxmon_megascale_dcn_transfer_latency_seconds"
    for q, value in QUANTILES:
        assert sample(s, name, source="libtpu", buffer_size="4MB+", quantile=f"{q:g}") == value
    assert sample(s, name + "_count", source="libtpu", buffer_size="4MB+") == 100
    assert sample(s, name + "_sum", source="libtpu", buffer_size="4MB+") == 0.15
    assert sample(s, name, source="libtpu", buffer_size="8MB+", quantile="0.9") == 0.0133
    assert sample(s, name, source="libtpu", buffer_size="8MB+", quantile="0.999") is None  # not in the reading
    rtt = "jaxmon_megascale_grpc_tcp_min_rtt_seconds"
    assert sample(s, rtt, source="libtpu", quantile="0.5") == 20e-6  # no buffer_size label
    assert sample(s, rtt + "_count", source="libtpu") == 8
    assert "# TYPE jaxmon_megascale_dcn_transfer_latency_seconds summary" in text
    # Families the reading has nothing for are left out, not rendered empty.
    assert "jaxmon_megascale_collective_end_to_end_latency_seconds" not in text
    assert "jaxmon_device_hlo_queue_size" not in text


def test_every_chip_series_takes_its_labels_from_chip_labels(context: Context) -> None:
    collector = with_stub(context, StubClient(reading()))
    s = parse_samples(exposition(collector, collector.update()))
    chip_series = [dict(lbls) for _, lbls in s if "device" in dict(lbls)]
    assert chip_series and all(lbls in (chip_labels(8), chip_labels(9)) for lbls in chip_series)
    host_series = [dict(lbls) for name, lbls in s if name.startswith("jaxmon_megascale_")]
    assert host_series
    assert all(
        {k: v for k, v in lbls.items() if k not in ("buffer_size", "quantile")} == host_labels() for lbls in host_series
    )


def test_metrics_not_served_here_are_logged_once_and_again_only_when_that_changes(context: Context) -> None:
    single_slice = reading(host={}, unserved=frozenset({DCN, RTT}))
    multi_slice = reading()
    collector = with_stub(context, StubClient(single_slice, single_slice, single_slice, multi_slice, single_slice))
    with capture_logs() as logs:
        for _ in range(5):
            assert collector.update().success  # never a failure of the poll
    lines = [e for e in logs if e["event"].startswith("libtpu does not serve")]
    assert [e["metrics"] for e in lines] == [sorted({DCN, RTT}), sorted({DCN, RTT})]  # polls 1 and 5


def test_a_failing_metric_is_logged_once_while_it_fails_and_once_when_it_answers_again(context: Context) -> None:
    failing = reading(host={RTT: reading().host[RTT]}, failed={DCN: "INTERNAL"})
    collector = with_stub(context, StubClient(failing, failing, failing, reading()))
    with capture_logs() as logs:
        updates = [collector.update() for _ in range(4)]
    assert [u.success for u in updates] == [False, False, False, True]  # the poll is partial while one fails
    s = parse_samples(exposition(collector, updates[0]))
    assert not [n for n, _ in s if n.startswith("jaxmon_megascale_dcn_transfer")]
    assert sample(s, "jaxmon_megascale_grpc_tcp_min_rtt_seconds_count", source="libtpu") == 8  # the rest is there
    assert sample(s, "jaxmon_device_memory_used_bytes", **chip_labels(9)) == 5 * GIB
    failed = [e for e in logs if e["event"] == "libtpu metric failed; its series are absent"]
    assert [(e["metric"], e["error"]) for e in failed] == [(DCN, "INTERNAL")]
    assert [e["metric"] for e in logs if e["event"] == "libtpu metric answers again"] == [DCN]


def test_a_metric_in_a_shape_jaxmon_does_not_read_is_absent_and_logged_once(context: Context) -> None:
    odd = reading(host={}, unreadable=frozenset({DCN}))
    collector = with_stub(context, StubClient(odd, odd, odd))
    with capture_logs() as logs:
        assert all(collector.update().success for _ in range(3))
    assert [e["metric"] for e in logs if "shape jaxmon does not read" in e["event"]] == [DCN]


def test_the_service_going_away_drops_the_host_series_too(context: Context) -> None:
    collector = with_stub(context, StubClient(reading(), libtpu.LibtpuUnavailable("UNAVAILABLE", "gone")))
    assert "jaxmon_megascale_" in exposition(collector, collector.update())
    update = collector.update()
    assert not update.success
    assert exposition(collector, update) == ""


def test_tpu_infos_package_imports_nothing_so_its_device_module_loads_no_grpc() -> None:
    """The collector's auto check runs `from tpu_info import device` (/sys only) in every daemon, node mode too.
    tpu-info 0.14.0 and 0.14.1's package __init__ imports its CLI, and with it grpc (about 20 MiB of RSS,
    tests/e2e/test_node_mode.py); 0.14.2's imports nothing (the floor in pyproject.toml, tests/floors.sh)."""
    spec = importlib.util.find_spec("tpu_info")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    assert [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)] == []


def test_inside_a_training_process_the_sdk_child_is_never_started() -> None:
    """Embedded, the SDK stays off whatever the setting: importing libtpu in a training process has crashed jobs,
    and the child is a process (which this unit test's isolation would refuse: the update must not start one)."""
    source = LocalSource(environ={})
    devices, _ = source.discover()
    embedded = standalone_context(source, devices, workload="trainer", in_process=InProcessWorkload(source))
    collector = TpuCollector(TpuOptions(enabled=True, sdk=True), embedded)
    collector._client = cast(libtpu.LibtpuClient, StubClient(reading()))
    update = collector.update()
    assert update.success and update.state.sdk is None
    assert "jaxmon_libtpu_sdk_status" not in exposition(collector, update)
    collector.stop()
