"""The kubelet stubs' generation, once it failed: not tried again at every poll, and tried again later."""

from __future__ import annotations

import sys

import pytest

from jaxmon.sources.kubelet import stubs


def test_a_failed_generation_is_not_retried_until_retry_seconds_have_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in stubs._MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(stubs, "_failed", None)
    calls: list[int] = []

    def failing() -> dict[str, str]:
        calls.append(1)
        raise stubs.StubsUnavailable("protoc failed on api.proto (status 1)")

    monkeypatch.setattr(stubs, "_generate", failing)
    with pytest.raises(stubs.StubsUnavailable, match="status 1"):
        stubs.stubs()
    with pytest.raises(stubs.StubsUnavailable, match=r"status 1\) \(not tried again until 600 s after that\)"):
        stubs.stubs()
    assert len(calls) == 1  # the second poll started no protoc
    monkeypatch.setattr(stubs, "RETRY_SECONDS", 0.0)
    with pytest.raises(stubs.StubsUnavailable):
        stubs.stubs()
    assert len(calls) == 2
