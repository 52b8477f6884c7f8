"""Settings: flags, JAXMON_* environment, YAML file and start() arguments, precedence, old names, and errors that
name the setting as the user wrote it.

What the command line makes of bad settings (exit 2 and the message) is tested in tests/unit/test_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import jaxmon
from jaxmon.compose import default_settings, load_settings, model
from jaxmon.settings import DEFAULT_PORT, SettingsError, parse_duration, parse_listen_address
from jaxmon.settings.errors import unused_environment

pytestmark = pytest.mark.usefixtures("no_jaxmon_env")


def _error(argv: list[str] | None = None, **options: object) -> str:
    with pytest.raises(SettingsError) as raised:
        load_settings(argv or [], **options)
    return str(raised.value)


def test_defaults() -> None:
    s = load_settings([])
    assert s.web.listen_address == f":{DEFAULT_PORT}" and DEFAULT_PORT >= 10000
    assert s.web.telemetry_path == "/metrics"
    assert s.collector_options("probe").enabled == "auto"
    assert s.max_staleness == 3 * s.poll.interval
    assert s.model_dump() == default_settings().model_dump()


def test_node_exporter_style_flags() -> None:
    s = load_settings(
        [
            "--web.listen-address",
            "127.0.0.1:1234",
            "--web.telemetry-path",
            "/m",
            "--no-collector.probe",
            "--collector.probe.interval",
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
    assert s.collector.probe.enabled is False  # type: ignore[attr-defined]
    assert s.collector.probe.interval == 120.0  # type: ignore[attr-defined]
    assert s.poll.interval == 0.5
    assert (s.log.level, s.log.format) == ("debug", "json")


def test_each_collector_owns_its_settings_under_collector() -> None:
    """The probe's and the spool's settings are in their collectors' sections, beside nvml's and tpu's."""
    s = load_settings(
        ["--collector.spool.dir", "/run/x", "--collector.probe.size", "64", "--collector.tpu.timeout", "1s"]
    )
    assert str(s.collector_options("spool").dir) == "/run/x"  # type: ignore[attr-defined]
    assert s.collector_options("probe").size == 64  # type: ignore[attr-defined]
    assert s.collector_options("tpu").timeout == 1.0  # type: ignore[attr-defined]
    assert not hasattr(s, "probe") and not hasattr(s, "spool")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["--probe.interval", "30s"], ["--collector.probe.interval", "30s"]),
        (["--spool.dir", "/run/jaxmon"], ["--collector.spool.dir", "/run/jaxmon"]),
        (["--spool.ttl=1m"], ["--collector.spool.ttl=1m"]),
    ],
)
def test_old_flag_names_still_work_and_are_noted(old: list[str], new: list[str]) -> None:
    s_old, s_new = load_settings(old), load_settings(new)
    assert s_old.model_dump() == s_new.model_dump()
    assert s_old.notes == [f"{old[0].split('=')[0]} is the old name of {new[0].split('=')[0]} (both work)"]
    assert s_new.notes == []


def test_old_variable_and_yaml_names_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "jaxmon.yml"
    cfg.write_text("spool:\n  ttl: 45s\nprobe:\n  size: 128\n")
    monkeypatch.setenv("JAXMON_PROBE__INTERVAL", "9s")
    s = load_settings(["--config.file", str(cfg)])
    assert s.collector.probe.interval == 9.0  # type: ignore[attr-defined]
    assert s.collector.probe.size == 128  # type: ignore[attr-defined]
    assert s.collector.spool.ttl == 45.0  # type: ignore[attr-defined]
    assert any("JAXMON_PROBE__INTERVAL is the old name of JAXMON_COLLECTOR__PROBE__INTERVAL" in n for n in s.notes)


def test_where_both_names_set_a_setting_the_current_name_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "jaxmon.yml"
    cfg.write_text("probe: {size: 64}\ncollector: {probe: {size: 32}}\n")
    monkeypatch.setenv("JAXMON_PROBE__INTERVAL", "9s")
    monkeypatch.setenv("JAXMON_COLLECTOR__PROBE__INTERVAL", "8s")
    s = load_settings(["--config.file", str(cfg)])
    assert (s.collector.probe.size, s.collector.probe.interval) == (32, 8.0)  # type: ignore[attr-defined]
    flags = load_settings(["--collector.probe.size", "16", "--probe.size", "8"])
    assert flags.collector.probe.size == 8  # type: ignore[attr-defined]  # flags: the last one, as argparse


def test_precedence_is_flags_then_environment_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "jaxmon.yml"
    cfg.write_text("poll:\n  interval: 7s\nprobe:\n  interval: 8s\n  size: 128\nweb:\n  telemetry_path: /x\n")
    monkeypatch.setenv("JAXMON_PROBE__INTERVAL", "9s")
    monkeypatch.setenv("JAXMON_COLLECTOR__PROBE__SIZE", "64")
    s = load_settings(["--config.file", str(cfg), "--probe.size", "32"])
    assert s.poll.interval == 7.0  # file only
    assert s.collector.probe.interval == 9.0  # type: ignore[attr-defined]  # environment beats file
    assert s.collector.probe.size == 32  # type: ignore[attr-defined]  # flag beats environment
    assert s.web.telemetry_path == "/x"
    assert s.config.file == cfg


def test_config_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("collector:\n  probe: false\n")
    monkeypatch.setenv("JAXMON_CONFIG__FILE", str(cfg))
    assert load_settings([]).collector_options("probe").enabled is False


def test_a_whole_section_as_json_in_one_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXMON_WEB", '{"listen_address": ":1234", "max_requests": 3}')
    monkeypatch.setenv("JAXMON_COLLECTOR__PROBE", "false")
    s = load_settings([])
    assert (s.web.listen_address, s.web.max_requests) == (":1234", 3)
    assert s.collector_options("probe").enabled is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--poll.interval", "soon"], "--poll.interval: not a duration: 'soon'"),
        (["--poll.interval", "0"], "--poll.interval: must be longer than 0s (got 0s)"),
        (["--poll.interval", "-1s"], "--poll.interval: must be longer than 0s (got -1s)"),
        (["--web.listen-address", "nowhere"], "--web.listen-address: expected host:port"),
        (["--web.listen-address", ":70000"], "out of range"),
        (["--web.telemetry-path", "metrics"], "--web.telemetry-path: must start with /"),
        (["--probe.size", "1"], "--probe.size: must be at least 8 (got '1')"),
        (["--collector.probe.size", "4096"], "--collector.probe.size: must be at most 2048 (got '4096')"),
        (["--log.level", "loud"], "--log.level:"),
        (["--gpu.memory-fraction", "2"], "--gpu.memory-fraction: must be at most 1 (got '2')"),
        (["--probe.spacing", "5s"], "--probe.spacing: must be at most 1s (got 5s)"),
        (["--collector.nvml.xid-wait", "20s"], "--collector.nvml.xid-wait: must be at most 10s (got 20s)"),
    ],
)
def test_invalid_values_name_the_flag_as_given_with_units(argv: list[str], message: str) -> None:
    assert message in _error(argv)


def test_a_probe_timeout_too_short_for_its_pauses_names_the_setting_given() -> None:
    """The check spans timeout, repeats and spacing; the error names the one the user set, with units."""
    assert _error(["--probe.timeout", "100ms"]) == (
        "invalid settings:\n  --probe.timeout: the probe timeout (100ms) must be longer than the pauses of one "
        "timing (up to 400ms: 1 + 1.5 x (repeats - 1) spacings, with repeats 3 and spacing 100ms); raise the "
        "timeout or lower the spacing or repeats"
    )
    both = _error(["--collector.probe.spacing", "1s", "--collector.probe.repeats", "5"])
    assert both.startswith(
        "invalid settings:\n  --collector.probe.repeats, --collector.probe.spacing: the probe timeout (5s)"
    )


def test_a_variable_inside_a_section_that_names_no_setting_is_an_error_with_what_was_meant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JAXMON_PROBE__INTERVL: the variable is named (not a flag), with the closest variable."""
    monkeypatch.setenv("JAXMON_PROBE__INTERVL", "30s")
    assert (
        _error() == "invalid settings:\n  JAXMON_PROBE__INTERVL: no such setting (did you mean JAXMON_PROBE__INTERVAL?)"
    )
    monkeypatch.delenv("JAXMON_PROBE__INTERVL")
    monkeypatch.setenv("JAXMON_COLLECTOR__SPOOL__TTLL", "3s")
    assert "did you mean JAXMON_COLLECTOR__SPOOL__TTL?" in _error()


def test_a_bad_value_in_a_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXMON_PROBE__INTERVAL", "soon")
    assert _error() == ("invalid settings:\n  JAXMON_PROBE__INTERVAL: not a duration: 'soon' (use e.g. 500ms, 10s, 2m)")


def test_an_unknown_flag_is_named_with_the_closest_flag_and_its_value_is_not_a_second_error() -> None:
    assert _error(["--web.listen-adress", ":1"]) == (
        "invalid settings:\n  --web.listen-adress: no such flag (did you mean --web.listen-address?)"
    )
    assert "--probe.intervl: no such flag (did you mean --probe.interval?)" in _error(["--probe.intervl=3s"])
    assert "unexpected argument 'extra'" in _error(["--poll.interval", "1s", "extra"])
    assert _error(["--poll.interval"]) == "invalid settings:\n  --poll.interval: needs a value"


def test_switches_take_true_or_false() -> None:
    assert load_settings(["--web.enable-profiling=true"]).web.enable_profiling is True
    assert load_settings(["--web.enable-profiling=false"]).web.enable_profiling is False
    assert load_settings(["--no-web.enable-profiling"]).web.enable_profiling is False
    assert "takes no value, or true/false (got 'maybe')" in _error(["--web.enable-profiling=maybe"])


def test_an_unknown_key_in_the_file_is_named_as_a_yaml_key_with_what_was_meant(tmp_path: Path) -> None:
    """A misspelt YAML key is reported as a key of that file, not as a flag, with the closest setting."""
    cfg = tmp_path / "c.yml"
    cfg.write_text("probe:\n  intervall: 3s\n")
    assert _error(["--config.file", str(cfg)]) == (
        f"invalid settings:\n  probe.intervall (config file {cfg}): no such setting (did you mean probe.interval?)"
    )
    cfg.write_text("collector:\n  spool:\n    dirr: /x\n")
    assert "collector.spool.dirr (config file" in _error(["--config.file", str(cfg)])
    assert "(did you mean collector.spool.dir?)" in _error(["--config.file", str(cfg)])


def test_a_bad_value_in_the_file_names_the_key_and_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("poll:\n  interval: soon\n")
    assert _error(["--config.file", str(cfg)]) == (
        f"invalid settings:\n  poll.interval (config file {cfg}): not a duration: 'soon' (use e.g. 500ms, 10s, 2m)"
    )


def test_a_flag_spelling_in_the_file_says_yaml_keys_use_underscores(tmp_path: Path) -> None:
    """`listen-address:` in YAML is the flag's spelling: the error says to write listen_address."""
    cfg = tmp_path / "c.yml"
    cfg.write_text("web:\n  listen-address: ':1234'\n")
    assert "web.listen-address (config file" in _error(["--config.file", str(cfg)])
    assert "YAML keys use underscores: write listen_address" in _error(["--config.file", str(cfg)])


def test_a_bad_value_is_described_once_without_pydantic_prefixes() -> None:
    """No "Value error," and the value shown once: the message already quotes it."""
    assert _error(["--poll.interval", "soon"]) == (
        "invalid settings:\n  --poll.interval: not a duration: 'soon' (use e.g. 500ms, 10s, 2m)"
    )


def test_log_level_and_format_from_the_environment_ignore_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAXMON_LOG__LEVEL=DEBUG is accepted as debug (and JSON as json)."""
    monkeypatch.setenv("JAXMON_LOG__LEVEL", "DEBUG")
    monkeypatch.setenv("JAXMON_LOG__FORMAT", "JSON")
    s = load_settings([])
    assert (s.log.level, s.log.format) == ("debug", "json")


def test_a_list_setting_from_the_environment_is_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAXMON_COLLECTOR__TRAINING__BADPUT_KINDS takes a JSON list, as docs/settings.md says; anything else is an error
    naming the variable."""
    monkeypatch.setenv("JAXMON_COLLECTOR__TRAINING__BADPUT_KINDS", '["data", "eval"]')
    assert load_settings([]).collector.training.badput_kinds == ["data", "eval"]  # type: ignore[attr-defined]
    monkeypatch.setenv("JAXMON_COLLECTOR__TRAINING__BADPUT_KINDS", "data,eval")
    assert "JAXMON_COLLECTOR__TRAINING__BADPUT_KINDS: Input should be a valid list" in _error()


def test_jaxmon_variables_outside_every_section_are_named_with_what_was_meant() -> None:
    """One underscore where two are needed, and a typo, are warned about; real settings (old names too) and
    jaxmon's own variables are not (a typo inside a section is an error: see above)."""
    environ = {
        "JAXMON_PROBE_INTERVAL": "30s",
        "JAXMON_POLLING__INTERVAL": "1s",
        "JAXMON_PROBE__INTERVAL": "30s",
        "JAXMON_COLLECTOR__PROBE__INTERVAL": "30s",
        "JAXMON_COLLECTOR__PROBE": "false",
        "JAXMON_WEB__CONFIG__FILE": "/w.yml",
        "JAXMON_FAULTS_FILE": "/f.json",
        "HOME": "/root",
    }
    assert unused_environment(environ, model()) == [
        ("JAXMON_POLLING__INTERVAL", "did you mean JAXMON_POLL__INTERVAL?"),
        ("JAXMON_PROBE_INTERVAL", "did you mean JAXMON_PROBE__INTERVAL? nested settings take two underscores"),
    ]


def test_jaxmon_start_reports_bad_settings_as_its_arguments_with_what_was_meant() -> None:
    """jaxmon.start() raises SettingsError naming its arguments (`prob=` -> did you mean probe?)."""
    with pytest.raises(jaxmon.SettingsError) as raised:
        jaxmon.start(prob={"interval": "30s"})
    assert str(raised.value) == "jaxmon.start: invalid settings:\n  prob: no such setting (did you mean probe?)"
    with pytest.raises(jaxmon.SettingsError) as raised:
        jaxmon.start(probe={"interval": "soon"}, poll={"intervall": 3})
    assert str(raised.value) == (
        "jaxmon.start: invalid settings:\n  poll.intervall: no such setting (did you mean poll.interval?)"
    )
    with pytest.raises(jaxmon.SettingsError) as raised:
        jaxmon.start(collector={"probe": {"interval": "soon"}})
    assert str(raised.value) == (
        "jaxmon.start: invalid settings:\n  collector.probe.interval: not a duration: 'soon' (use e.g. 500ms, 10s, 2m)"
    )


@pytest.mark.parametrize("content", ["[1, 2]", "a: [unclosed", "42"])
def test_a_file_that_is_not_a_settings_mapping_is_rejected(tmp_path: Path, content: str) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(content)
    assert "config.file" in _error(["--config.file", str(cfg)])


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    assert "config.file: cannot read" in _error(["--config.file", str(tmp_path / "absent.yml")])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("3s", 3.0), ("2m", 120.0), ("1h", 3600.0), ("4", 4.0), (".5s", 0.5), ("-1s", -1.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
