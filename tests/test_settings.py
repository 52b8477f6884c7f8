"""Settings: flags, JAXMON_* environment, YAML file, precedence, and errors that name the setting.

What the command line makes of bad settings (exit 2 and the message) is tested in test_cli.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import jaxmon
from jaxmon.settings import (
    DEFAULT_PORT,
    Settings,
    SettingsError,
    load_settings,
    parse_duration,
    parse_listen_address,
)
from jaxmon.settings_check import unused_environment


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("JAXMON_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = load_settings([])
    assert s.web.listen_address == f":{DEFAULT_PORT}" and DEFAULT_PORT >= 10000
    assert s.web.telemetry_path == "/metrics"
    assert s.collector_options("probe").enabled == "auto"
    assert s.max_staleness == 3 * s.poll.interval


def test_node_exporter_style_flags() -> None:
    s = load_settings(
        [
            "--web.listen-address",
            "127.0.0.1:1234",
            "--web.telemetry-path",
            "/m",
            "--no-collector.probe",
            "--probe.interval",
            "2m",
            "--poll.interval",
            "500ms",
            "--log.level",
            "debug",
            "--log.format",
            "json",
        ]
    )
    assert parse_listen_address(s.web.listen_address) == ("127.0.0.1", 1234)
    assert s.web.telemetry_path == "/m"
    assert s.collector_options("probe").enabled is False
    assert s.probe.interval == 120.0
    assert s.poll.interval == 0.5
    assert (s.log.level, s.log.format) == ("debug", "json")


def test_precedence_is_flags_then_environment_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "jaxmon.yml"
    cfg.write_text("poll:\n  interval: 7s\nprobe:\n  interval: 8s\n  size: 128\nweb:\n  telemetry_path: /x\n")
    monkeypatch.setenv("JAXMON_PROBE__INTERVAL", "9s")
    monkeypatch.setenv("JAXMON_PROBE__SIZE", "64")
    s = load_settings(["--config.file", str(cfg), "--probe.size", "32"])
    assert s.poll.interval == 7.0  # file only
    assert s.probe.interval == 9.0  # environment beats file
    assert s.probe.size == 32  # flag beats environment
    assert s.web.telemetry_path == "/x"
    assert s.config.file == cfg


def test_config_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collector:\n  probe: false\n")
    monkeypatch.setenv("JAXMON_CONFIG__FILE", str(cfg))
    assert load_settings([]).collector_options("probe").enabled is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--poll.interval", "soon"], "poll.interval"),
        (["--poll.interval", "0"], "poll.interval"),
        (["--web.listen-address", "nowhere"], "web.listen_address"),
        (["--web.listen-address", ":70000"], "out of range"),
        (["--web.telemetry-path", "metrics"], "web.telemetry_path"),
        (["--probe.size", "1"], "probe.size"),
        (["--log.level", "loud"], "log.level"),
        (["--gpu.memory-fraction", "2"], "gpu.memory_fraction"),
    ],
)
def test_invalid_values_name_the_setting(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(argv)


def test_an_unknown_key_in_the_file_is_named_as_a_yaml_key_with_what_was_meant(tmp_path: Path) -> None:
    """A misspelt YAML key is reported as a key of that file, not as a flag, with the closest setting."""
    cfg = tmp_path / "c.yml"
    cfg.write_text("probe:\n  intervall: 3s\n")
    with pytest.raises(SettingsError) as raised:
        load_settings(["--config.file", str(cfg)])
    assert str(raised.value) == (
        f"invalid settings (config file {cfg}):\n  probe.intervall: no such setting (did you mean probe.interval?)"
    )


def test_a_flag_spelling_in_the_file_says_yaml_keys_use_underscores(tmp_path: Path) -> None:
    """`listen-address:` in YAML is the flag's spelling: the error says to write listen_address."""
    cfg = tmp_path / "c.yml"
    cfg.write_text("web:\n  listen-address: ':1234'\n")
    with pytest.raises(SettingsError, match=r"web\.listen-address: YAML keys use underscores: write listen_address"):
        load_settings(["--config.file", str(cfg)])


def test_a_bad_value_is_described_once_without_pydantic_prefixes() -> None:
    """No "Value error," and the value shown once: the message already quotes it."""
    with pytest.raises(SettingsError) as raised:
        load_settings(["--poll.interval", "soon"])
    assert str(raised.value) == (
        "invalid settings:\n  poll.interval (--poll.interval): not a duration: 'soon' (use e.g. 500ms, 10s, 2m)"
    )


def test_log_level_and_format_from_the_environment_ignore_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAXMON_LOG__LEVEL=DEBUG is accepted as debug (and JSON as json)."""
    monkeypatch.setenv("JAXMON_LOG__LEVEL", "DEBUG")
    monkeypatch.setenv("JAXMON_LOG__FORMAT", "JSON")
    s = load_settings([])
    assert (s.log.level, s.log.format) == ("debug", "json")


def test_jaxmon_variables_that_set_nothing_are_named_with_what_was_meant() -> None:
    """One underscore where two are needed, and a typo, are warned about; real settings and jaxmon's own are not."""
    environ = {
        "JAXMON_PROBE_INTERVAL": "30s",
        "JAXMON_POLL__INTERVALL": "1s",
        "JAXMON_PROBE__INTERVAL": "30s",
        "JAXMON_COLLECTOR__PROBE": "false",
        "JAXMON_WEB__CONFIG__FILE": "/w.yml",
        "JAXMON_FAULTS_FILE": "/f.json",
        "HOME": "/root",
    }
    assert unused_environment(environ, Settings) == [
        ("JAXMON_POLL__INTERVALL", "did you mean JAXMON_POLL__INTERVAL?"),
        ("JAXMON_PROBE_INTERVAL", "did you mean JAXMON_PROBE__INTERVAL? nested settings take two underscores"),
    ]


def test_jaxmon_start_reports_bad_settings_in_the_cli_wording() -> None:
    """jaxmon.start() raises SettingsError with one plain line per setting, not pydantic's multi-line dump."""
    with pytest.raises(jaxmon.SettingsError) as raised:
        jaxmon.start(probe={"interval": "soon"}, poll={"intervall": 3})
    assert str(raised.value) == (
        "jaxmon.start: invalid settings:\n"
        "  poll.intervall: no such setting\n"
        "  probe.interval: not a duration: 'soon' (use e.g. 500ms, 10s, 2m)"
    )


@pytest.mark.parametrize("content", ["[1, 2]", "a: [unclosed", "42"])
def test_a_file_that_is_not_a_settings_mapping_is_rejected(tmp_path: Path, content: str) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(content)
    with pytest.raises(SettingsError, match=r"config\.file"):
        load_settings(["--config.file", str(cfg)])


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"config\.file: cannot read"):
        load_settings(["--config.file", str(tmp_path / "absent.yml")])


@pytest.mark.parametrize(("text", "seconds"), [("250ms", 0.25), ("3s", 3.0), ("2m", 120.0), ("1h", 3600.0), ("4", 4.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
