"""The SDK's strings as series (jaxmon/sources/libtpu/sdk_state.py, jaxmon.families.libtpu): percentages to
ratios, cores onto chips, the status set. The child process itself runs in tests/e2e/test_tpu_sdk.py."""

from __future__ import annotations

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from jaxmon.families.libtpu import sdk_families
from jaxmon.sources.libtpu import sdk
from jaxmon.sources.libtpu import sdk_state as tpu_sdk
from tests.conftest import sample
from tests.helpers import parse_samples


def reading(util: list[str], chips: int | None = None, status: str = "ok") -> sdk.SdkReading:
    data = {sdk.TENSORCORE_UTIL: tuple(util)}
    if chips is not None:
        data["hbm_capacity_total"] = tuple("17179869184" for _ in range(chips))
    return sdk.SdkReading(status, data=data)


def test_percentages_become_ratios_and_a_bad_figure_is_left_out() -> None:
    assert sdk.percents(["12.5", "100", "0", " 7.25% "]) == [0.125, 1.0, 0.0, 0.0725]
    assert sdk.percents(["nan", "-1", "100.5", "inf", "busy", ""]) == [None] * 6


def test_one_core_a_chip_takes_libtpu_device_ids_in_order() -> None:
    found, bad = tpu_sdk.cores(reading(["10", "20", "30", "40"], chips=4), [13, 8, 12, 9])
    assert [(c.device, c.core, c.ratio) for c in found] == [
        ("8", 0, 0.1),
        ("9", 1, 0.2),
        ("12", 2, 0.3),
        ("13", 3, 0.4),
    ]
    assert bad == 0


def test_two_cores_a_chip_share_the_chip_label() -> None:
    found, _ = tpu_sdk.cores(reading(["10", "20", "30", "40"], chips=2), [0, 1])
    assert [(c.device, c.core) for c in found] == [("0", 0), ("0", 1), ("1", 2), ("1", 3)]


def test_without_matching_grpc_ids_the_chip_position_is_the_label() -> None:
    # The gRPC service did not answer (no ids), or answered another count: positions, never a guessed id.
    for ids in ([], [4, 5, 6]):
        found, _ = tpu_sdk.cores(reading(["10", "20"], chips=2), ids)
        assert [c.device for c in found] == ["0", "1"]
    # No per-chip metric answered: one core a chip.
    found, _ = tpu_sdk.cores(reading(["10", "20"]), [])
    assert [c.device for c in found] == ["0", "1"]


def test_an_unreadable_entry_costs_its_core_only_and_all_unreadable_is_a_failure() -> None:
    st = tpu_sdk.state(reading(["10", "oops"], chips=2), starts=1, libtpu_ids=[])
    assert st.status == "ok" and [c.core for c in st.cores] == [0] and st.unreadable == 1
    st = tpu_sdk.state(reading(["oops"], chips=1), starts=1, libtpu_ids=[])
    assert st.status == "failed" and "oops" in st.detail and not st.cores


@pytest.mark.parametrize("status", sdk.STATUSES)
def test_the_status_set_has_one_series_at_1(status: str) -> None:
    st = tpu_sdk.SdkState(status, starts=3, cores=(tpu_sdk.CoreUtilization("8", 0, 0.5),))
    registry = CollectorRegistry()

    class Fams:
        def collect(self):  # type: ignore[no-untyped-def]
            return sdk_families(st)

    registry.register(Fams())
    s = parse_samples(generate_latest(registry).decode())
    for name in sdk.STATUSES:
        assert sample(s, "jaxmon_libtpu_sdk_status", source="libtpu", status=name) == (1.0 if name == status else 0.0)
    assert sample(s, "jaxmon_libtpu_sdk_child_starts_total", source="libtpu") == 3
    labels = {"device": "8", "platform": "tpu", "source": "libtpu", "core": "0"}
    assert sample(s, "jaxmon_device_tensorcore_utilization_ratio", **labels) == 0.5


def test_no_state_no_series() -> None:
    assert list(sdk_families(None)) == []
