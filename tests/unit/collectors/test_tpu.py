"""The tpu collector without a libtpu service: when `auto` runs it, and its flags.

The collector against a real gRPC libtpu service on loopback (tests/fake_libtpu.py) is
tests/e2e/collectors/test_tpu.py.
"""

from __future__ import annotations

import pytest

from jaxmon.app import load_settings
from jaxmon.collectors.base import Context, standalone_context
from jaxmon.collectors.tpu import TpuCollector, TpuOptions
from jaxmon.settings import SettingsError
from jaxmon.sources.local import LocalSource


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
