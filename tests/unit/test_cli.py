"""`jaxmon.cli.main(argv)` in-process: exit codes and the messages that name what is wrong.

Every case here ends before the daemon would serve (bad input, --help, --version); the daemon as a real process
(signals, exit 0 on SIGTERM) is tested in tests/e2e/test_daemon_cpu.py, a port already taken in tests/e2e/test_cli.py.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from jaxmon.collectors import registry
from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.training import TrainingProfileOptions
from jaxmon.compose import load_settings
from jaxmon.settings.help import WORKLOAD_ONLY
from jaxmon.sources.replay import ReplaySource
from tests.conftest import CLI, FIXTURES, ROOT

REPLAY = ["--replay", str(FIXTURES / "shapes.json")]


pytestmark = pytest.mark.usefixtures("no_jaxmon_env")


def test_version_prints_the_installed_version_and_exits_0(cli: CLI) -> None:
    code, out, _ = cli("--version")
    assert (code, out) == (0, f"jaxmon {metadata.version('jaxmon')}\n")


def test_help_exits_0_on_stdout_and_no_command_is_a_usage_error_on_stderr(cli: CLI) -> None:
    """--help: usage on stdout, 0. No command: usage on stderr, nothing on stdout, 2 (as argparse reports one)."""
    code, out, _ = cli("--help")
    assert code == 0 and out.startswith("usage: jaxmon {serve,snapshot,top,healthcheck}")
    code, out, err = cli()
    assert (code, out) == (2, "") and err.startswith("usage: jaxmon {serve,snapshot,top,healthcheck}")


def test_an_unknown_command_exits_2_naming_it_with_what_was_meant(cli: CLI) -> None:
    code, _, err = cli("frobnicate", "--x")
    assert code == 2
    assert err.startswith("jaxmon: unknown command 'frobnicate'\nusage: jaxmon")
    assert cli("serv")[2].startswith("jaxmon: unknown command 'serv' (did you mean serve?)\nusage: jaxmon")


def test_serve_help_exits_0_and_lists_the_dotted_flags_and_collectors(cli: CLI) -> None:
    code, out, _ = cli("serve", "--help")
    assert code == 0
    for flag in (
        "--web.listen-address",
        "--web.telemetry-path",
        "--no-collector.probe",
        "--collector.probe.interval",
        "--collector.spool.dir",
        "--collector.tpu.address",
        "--poll.interval",
        "--replay",
        "--log.level",
        "--log.format",
        "--config.file",
    ):
        assert flag in out, flag
    assert "collectors (each is also --collector.NAME.enabled {true,false,auto}):" in out
    assert "--probe." not in out and "--spool." not in out  # the old names work, the help shows the new ones


def test_every_flag_in_the_help_has_a_description(cli: CLI) -> None:
    """Each collector's --collector.X.enabled says what auto means for it (they were once left blank)."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    lines = out.splitlines()
    blank = [
        line.split()[0]
        for i, line in enumerate(lines)
        if line.startswith("  --")
        and len(line.split()) <= 2
        and (i + 1 == len(lines) or not lines[i + 1].startswith(" " * 10))
    ]
    assert blank == []
    assert "tpu-info is installed" not in out


def test_serve_help_shows_durations_and_paths_as_the_user_writes_them(cli: CLI) -> None:
    """Durations and numbers show an example (their default, as the user writes it), paths PATH, collectors
    {true,false,auto}: no Python types."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    out = " ".join(out.split())  # argparse wraps lines wherever the width falls
    assert "--collector.probe.interval 15s Time between probe runs on each device. (default: 15s)" in out
    assert "--collector.probe.target 2ms" in out and "(default: 2ms)" in out
    assert "--collector.nvml.xid-wait 500ms" in out and "(default: 500ms)" in out
    assert "--config.file PATH" in out and "--replay PATH" in out
    assert "--collector.probe.enabled {true,false,auto}" in out
    for python_word in ("float (", "{Path,None}", "{float,None}", "{bool,auto}", "(default: None)", "15.0"):
        assert python_word not in out, python_word


_VALUED_FLAG = re.compile(r"^  (--[a-z.-]+) (\S+)", re.MULTILINE)


def test_serve_help_shows_an_example_value_where_it_showed_a_type(cli: CLI) -> None:
    """`--web.listen-address :10401`, `--web.max-requests 40`, `--collector.training.peak-flops 989e12`: never
    `str`, `int`, `float` or `DURATION`."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    shown = dict(_VALUED_FLAG.findall(out))
    assert shown["--web.listen-address"] == ":10401"
    assert shown["--web.max-requests"] == "40"
    assert shown["--collector.probe.interval"] == "15s"
    assert shown["--collector.training.peak-flops"] == "989e12"  # no default: an example
    assert shown["--health.max-staleness"] == "15s"
    assert shown["--gpu.memory-fraction"] == "0.02"
    types = {flag: value for flag, value in shown.items() if value in {"str", "int", "float", "DURATION"}}
    assert types == {}
    assert "[--web.max-requests 40]" in out  # the usage line too


def test_every_example_in_the_help_is_accepted_as_it_is_shown(cli: CLI) -> None:
    """A user who copies a flag with its example gets a valid setting (an example out of a field's bounds, or one
    the parser reads otherwise, fails here)."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    sections = out[: out.index("collectors (each is also")]
    valued = {
        flag: value
        for flag, value in _VALUED_FLAG.findall(sections)
        if not value.startswith("{") and value not in {"PATH", "NAMES"} and not flag.startswith("--no-")
    }
    assert len(valued) > 25
    argv = [part for flag, value in valued.items() for part in (flag, value)]
    settings = load_settings(argv)
    assert settings.web.max_requests == 40
    assert settings.collector_options("training").model_dump()["peak_flops"] == 989e12
    assert settings.collector_options("spool").model_dump()["remove_after"] == 300


def test_the_workload_only_sections_say_so_and_are_exactly_the_collectors_a_daemon_cannot_run(cli: CLI) -> None:
    """--collector.training.*, --collector.compile.*, --collector.checkpoint.* and --collector.default-registry.* act
    only inside the workload process: their sections are marked, and a collector that refuses to run outside a
    workload is one of them (a new one must be added to WORKLOAD_ONLY)."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    marked = set(re.findall(r"^(collector\.[a-z-]+) options \(workload only\):$", out, re.MULTILINE))
    assert marked == {"collector.training", "collector.compile", "collector.checkpoint", "collector.default-registry"}
    assert "jaxmon.start(collector={'training': {...}})" in " ".join(out.split())
    daemon = standalone_context(ReplaySource(FIXTURES / "shapes.json"))
    refusing = {
        f"collector.{name.replace('_', '-')}"
        for name, cls in registry().items()
        if cls.unavailable(cls.options(), daemon) == daemon.not_in_workload()
    }
    assert refusing == set(WORKLOAD_ONLY) == marked
    # The other sections are not marked.
    assert "collector.spool options:" in out and "collector.probe options:" in out


def test_the_sampled_trace_options_say_they_act_in_training_workloads_only_in_every_form(cli: CLI) -> None:
    """--collector.training.profile.every, .steps and .min-seconds: their nested section is marked workload only in
    `jaxmon serve --help`, each flag's own help says it, and so do the descriptions the YAML keys and the
    JAXMON_COLLECTOR__TRAINING__PROFILE__* variables share with the flags; docs/settings.md's rows say it too."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    section = out[out.index("collector.training.profile options") :]
    section = section[: section.index("\n\ncollector.", 1)]
    title, note = section.split("\n", 1)
    assert title == "collector.training.profile options (workload only):"
    assert "never on the daemon's own devices" in " ".join(note.split())
    flags = re.split(r"\n  (?=--)", section)[1:]
    assert [f.split()[0] for f in flags] == [
        "--collector.training.profile.every",
        "--collector.training.profile.steps",
        "--collector.training.profile.min-seconds",
    ]
    for help_text in flags:
        words = " ".join(help_text.split())
        assert "Training workloads only" in words and "never the daemon's own devices" in words, words
    for name, field in TrainingProfileOptions.model_fields.items():
        assert field.description and field.description.startswith("Training workloads only ("), name
    rows = [
        line
        for line in (ROOT / "docs" / "settings.md").read_text().splitlines()
        if line.startswith("| `--collector.training.profile.")
    ]
    assert len(rows) == 3 and all("**workload only**" in row for row in rows), rows


def test_the_collectors_list_is_apart_from_the_last_section(cli: CLI) -> None:
    """A blank line before "collectors (...)", as before every section argparse prints."""
    code, out, _ = cli("serve", "--help")
    assert code == 0
    before = out[: out.index("collectors (each is also")]
    assert before.endswith("YAML file with any of these settings.\n\n")


def test_snapshot_help_lists_json_and_leaves_out_the_serve_only_flags(cli: CLI) -> None:
    """`jaxmon snapshot --help` names its own --json and none of the flags it would ignore (it serves nothing and
    runs once: no web, health, poll or collector intervals); they are still accepted (a shared config sets them)."""
    code, out, _ = cli("snapshot", "--help")
    assert code == 0
    assert "--json" in out and "print JSON instead of a table" in out
    for serve_only in ("--web.", "--health.", "--poll.", "--collector.probe.interval"):
        assert serve_only not in out, serve_only
    assert "--collector.probe.size" in out and "--replay" in out
    code, out, err = cli("snapshot", *REPLAY, "--poll.interval", "1s", "--web.listen-address", ":1")
    assert code == 0, err


def test_snapshot_prints_its_table_and_no_log_lines(cli: CLI) -> None:
    """`jaxmon snapshot` is a command, not a daemon: warnings and errors only, unless --log.level says more."""
    code, out, err = cli("snapshot", *REPLAY, "--log.format", "json")
    assert code == 0 and out.startswith("device")
    levels = {json.loads(line)["level"] for line in err.splitlines()}
    assert levels <= {"warning", "error"}, err  # shapes.json has a failing device: that warning stays
    code, _, err = cli("snapshot", *REPLAY, "--log.level", "info", "--log.format", "json")
    assert code == 0 and "devices discovered" in err


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
            "jaxmon serve: invalid settings:\n  --poll.interval: not a duration: 'soon' (use e.g. 500ms, 10s, 2m)\n",
        ),
        (["serve", "--bogus"], {}, "jaxmon serve: invalid settings:\n  --bogus: no such flag\n"),
        (
            ["serve", "--web.listen-adress", ":1"],
            {},
            "--web.listen-adress: no such flag (did you mean --web.listen-address?)\n",
        ),
        (["serve"], {"JAXMON_PROBE__TIMEOUT": "-1"}, "JAXMON_PROBE__TIMEOUT: must be longer than 0s (got -1s)"),
        (["serve"], {"JAXMON_PROBE__INTERVL": "30s"}, "JAXMON_PROBE__INTERVL: no such setting (did you mean"),
        (["serve", "--replay", "/nonexistent/replay.json"], {}, "replay file /nonexistent/replay.json: cannot read"),
        (["snapshot", "--log.format", "xml"], {}, "jaxmon snapshot: invalid settings:\n  --log.format: "),
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
