"""`jaxmon.cli.main(argv)` in-process: exit codes and the messages that name what is wrong.

Every case here ends before the daemon would serve (bad input, --help, --version); the daemon as a real process
(signals, exit 0 on SIGTERM) is tested in test_daemon_cpu.py.
"""

from __future__ import annotations

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


def test_help_exits_0_and_no_command_exits_2_both_with_the_usage(cli: CLI) -> None:
    code, out, _ = cli("--help")
    assert code == 0 and out.startswith("usage: jaxmon {serve,snapshot}")
    code, out, _ = cli()
    assert code == 2 and out.startswith("usage: jaxmon {serve,snapshot}")


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


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["serve", "--poll.interval", "soon"],
            {},
            "poll.interval (--poll.interval): Value error, not a duration",
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
        assert f"jaxmon {command}: --replay: " in err and "devices.0.memory_stats" in err, err


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
