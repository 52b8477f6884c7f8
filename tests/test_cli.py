"""`jaxmon.cli.main(argv)` in-process: exit codes and the messages that name what is wrong.

Every case here ends before the daemon would serve (bad input, --help, --version); the daemon as a real process
(signals, exit 0 on SIGTERM) is tested in test_daemon_cpu.py.
"""

from __future__ import annotations

import json
import os
import socket
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.conftest import CLI, FIXTURES

REPLAY = ["--replay", str(FIXTURES / "shapes.json")]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("JAXMON_"):
            monkeypatch.delenv(name)


def test_version_prints_the_installed_version_and_exits_0(cli: CLI) -> None:
    code, out, _ = cli("--version")
    assert (code, out) == (0, f"jaxmon {metadata.version('jaxmon')}\n")


def test_help_exits_0_on_stdout_and_no_command_is_a_usage_error_on_stderr(cli: CLI) -> None:
    """--help: usage on stdout, 0. No command: usage on stderr, nothing on stdout, 2 (as argparse reports one)."""
    code, out, _ = cli("--help")
    assert code == 0 and out.startswith("usage: jaxmon {serve,snapshot,top}")
    code, out, err = cli()
    assert (code, out) == (2, "") and err.startswith("usage: jaxmon {serve,snapshot,top}")


def test_an_unknown_command_exits_2_naming_it(cli: CLI) -> None:
    code, _, err = cli("frobnicate", "--x")
    assert code == 2
    assert err.startswith("jaxmon: unknown command 'frobnicate'\nusage: jaxmon")


def test_serve_help_exits_0_and_lists_the_dotted_flags_and_collectors(cli: CLI) -> None:
    code, out, _ = cli("serve", "--help")
    assert code == 0
    for flag in (
        "--web.listen-address",
        "--web.telemetry-path",
        "--no-collector.probe",
        "--probe.interval",
        "--poll.interval",
        "--replay",
        "--log.level",
        "--log.format",
        "--config.file",
    ):
        assert flag in out, flag
    assert "collectors (each is also --collector.NAME.enabled {true,false,auto}):" in out


def test_serve_help_shows_durations_and_paths_as_the_user_writes_them(cli: CLI) -> None:
    """Durations read DURATION with a default like 15s, paths PATH, collectors {true,false,auto}: no Python types."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    out = " ".join(out.split())  # argparse wraps lines wherever the width falls
    assert "--probe.interval DURATION Time between probe runs on each device. (default: 15s)" in out
    assert "--probe.target DURATION" in out and "(default: 2ms)" in out
    assert "--config.file PATH" in out and "--replay PATH" in out
    assert "--collector.probe.enabled {true,false,auto}" in out
    for python_word in ("float (", "{Path,None}", "{float,None}", "{bool,auto}", "(default: None)", "15.0"):
        assert python_word not in out, python_word


def test_snapshot_help_lists_json_and_leaves_out_the_server_flags(cli: CLI) -> None:
    """`jaxmon snapshot --help` names its own --json and none of the --web.* flags, which it would ignore."""
    code, out, _ = cli("snapshot", "--help")
    assert code == 0
    assert "--json" in out and "print JSON instead of a table" in out
    assert "--web." not in out
    assert "--probe.interval" in out


def test_a_jaxmon_variable_that_sets_nothing_is_warned_about(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """`JAXMON_PROBE_INTERVAL=30s` (one underscore) is not silently ignored: the log says what was meant."""
    monkeypatch.setenv("JAXMON_PROBE_INTERVAL", "30s")
    code, _, err = cli("snapshot", *REPLAY, "--log.format", "json")
    assert code == 0, err
    warnings = [json.loads(line) for line in err.splitlines() if "sets nothing" in line]
    assert [(w["variable"], w["hint"]) for w in warnings] == [
        ("JAXMON_PROBE_INTERVAL", "did you mean JAXMON_PROBE__INTERVAL? nested settings take two underscores")
    ]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["serve", "--poll.interval", "soon"],
            {},
            "poll.interval (--poll.interval): not a duration: 'soon' (use e.g. 500ms, 10s, 2m)\n",
        ),
        (["serve", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["serve"], {"JAXMON_PROBE__TIMEOUT": "-1"}, "probe.timeout"),
        (["serve", "--replay", "/nonexistent/replay.json"], {}, "replay file /nonexistent/replay.json: cannot read"),
        (["snapshot", "--log.format", "xml"], {}, "jaxmon snapshot: invalid settings:\n  log.format (--log.format)"),
    ],
)
def test_bad_settings_exit_2_with_a_message_naming_the_setting(
    cli: CLI, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = cli(*args)
    assert code == 2, err
    assert message in err


def test_a_bad_replay_file_exits_2_naming_the_field(cli: CLI, tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text('{"devices": [{"id": 0, "platform": "gpu", "memory_stats": {"bytes_in_use": "lots"}}]}')
    for command in ("serve", "snapshot"):
        code, _, err = cli(command, "--replay", str(bad))
        assert code == 2, command
        # The field as the file has it, without pydantic's union tags (dict[str,nullable[union[int,float]]]).
        assert err == (
            f"jaxmon {command}: --replay: replay file {bad}: devices.0.memory_stats.bytes_in_use: "
            "must be a number (got 'lots')\n"
        )


def test_a_bad_web_config_exits_2_naming_the_key(cli: CLI, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": "a.pem", "key_file": "a.key", "min_version": "SSL3"}})
    )
    code, _, err = cli("serve", *REPLAY, "--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web))
    assert code == 2
    assert "jaxmon serve: --web.config.file: " in err
    assert "tls_server_config.min_version: unknown TLS version 'SSL3'" in err


def test_a_port_in_use_exits_1_naming_the_address(cli: CLI) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, err = cli("serve", *REPLAY, "--web.listen-address", address)
    assert code == 1
    assert f"jaxmon serve: cannot listen on {address}: " in err
